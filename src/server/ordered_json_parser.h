// ordered_json_parser.h — internal: JSON text to nlohmann::ordered_json in time linear in its
// size. nlohmann's own parse inserts each object key with a linear search of the keys before it
// (ordered_map is a vector), so one object of n keys costs n^2 / 2 comparisons, and a request
// body within the default 1 MiB limit holds tens of thousands of keys. This parser drives
// nlohmann's SAX interface and indexes each open object's keys in a hash map instead. The result is the same value nlohmann's parse gives
// (keys in the order written; a repeated key keeps its first position and its last value).
// Thread-safety: a pure function.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace fdl::server {

/// `text` as ordered JSON, or a discarded value (is_discarded()) when it is not valid JSON;
/// then `error`, when given, receives nlohmann's message, which names the byte position.
nlohmann::ordered_json parse_ordered_json(std::string_view text, std::string* error = nullptr);

}  // namespace fdl::server

#include "server/ordered_json_parser.h"

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/json_error_text.h"

namespace fdl::server {
namespace {

using OJ = nlohmann::ordered_json;

// Builds the value as nlohmann's DOM parser does, appending object members straight to the
// ordered_map's vector once the key index says the key is new.
class OrderedBuilder final : public nlohmann::json_sax<OJ> {
 public:
  OJ result;

  bool null() override { return put(OJ(nullptr)); }
  bool boolean(bool v) override { return put(OJ(v)); }
  bool number_integer(number_integer_t v) override { return put(OJ(v)); }
  bool number_unsigned(number_unsigned_t v) override { return put(OJ(v)); }
  bool number_float(number_float_t v, const string_t&) override { return put(OJ(v)); }
  bool string(string_t& v) override { return put(OJ(std::move(v))); }
  bool binary(binary_t& v) override { return put(OJ::binary(std::move(v))); }
  bool start_object(std::size_t) override { return open(OJ::object()); }
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(OJ::array()); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error = json_error_text(e);
    return false;
  }
  std::string error;  // nlohmann's message for the first error

 private:
  struct Container {
    OJ* value;
    std::unordered_map<std::string, size_t> keys;  // an object's keys -> their positions
  };

  // Where the next value goes: the root, the open array's end, or the open object's member
  // named by the last key. A container stays at its address while it is open: its parent gets
  // no other member until it closes.
  OJ* place(OJ v) {
    if (open_.empty()) {
      result = std::move(v);
      return &result;
    }
    Container& top = open_.back();
    if (top.value->is_array()) {
      top.value->push_back(std::move(v));
      return &top.value->back();
    }
    auto& members = static_cast<OJ::object_t::Container&>(top.value->get_ref<OJ::object_t&>());
    const auto [at, fresh] = top.keys.emplace(key_, members.size());
    if (!fresh) {
      members[at->second].second = std::move(v);
      return &members[at->second].second;
    }
    members.emplace_back(std::move(key_), std::move(v));
    return &members.back().second;
  }
  bool put(OJ v) {
    place(std::move(v));
    return true;
  }
  bool open(OJ v) {
    open_.push_back(Container{place(std::move(v)), {}});
    return true;
  }
  bool close() {
    open_.pop_back();
    return true;
  }

  std::vector<Container> open_;
  std::string key_;
};

}  // namespace

nlohmann::ordered_json parse_ordered_json(std::string_view text, std::string* error) {
  OrderedBuilder builder;
  if (!OJ::sax_parse(text, &builder)) {
    if (error != nullptr) *error = builder.error;
    return OJ(OJ::value_t::discarded);
  }
  return std::move(builder.result);
}

}  // namespace fdl::server

#include "server/response_format.h"

#include <string>
#include <vector>

#include "grammar/json_schema.h"
#include "server/json_fields.h"
#include "server/openai_error.h"

namespace fdl::server {
namespace {

std::shared_ptr<const Grammar> compile(const std::string& gbnf, const std::string& param, const char* what,
                                       grammar::GrammarCache& cache) {
  try {
    return cache.get(gbnf);
  } catch (const GrammarError& e) {
    throw invalid_param(param, std::string("invalid ") + what + ": " + e.what());
  }
}

// The schema at `path` (keys from the body's root) of the ordered body, else of `schema`'s
// sorted form.
std::shared_ptr<const Grammar> from_schema(const nlohmann::json& schema, const nlohmann::ordered_json* ordered,
                                           const std::vector<const char*>& path, const std::string& param,
                                           grammar::GrammarCache& cache) {
  if (!schema.is_object() && !schema.is_boolean())
    throw invalid_param(param, "'" + param + "' must be a JSON schema object, got " + json_type_name(schema));
  const nlohmann::ordered_json* node = ordered;
  for (const char* key : path) {
    if (node == nullptr || !node->is_object() || !node->contains(key)) {
      node = nullptr;
      break;
    }
    node = &(*node)[key];
  }
  std::string gbnf;
  try {
    gbnf = node != nullptr ? grammar::json_schema_to_gbnf(*node) : grammar::json_schema_to_gbnf(schema);
  } catch (const GrammarError& e) {
    throw invalid_param(param, std::string("invalid JSON schema: ") + e.what());
  }
  return compile(gbnf, param, "JSON schema", cache);
}

std::shared_ptr<const Grammar> from_response_format(const nlohmann::json& rf, const nlohmann::ordered_json* ordered,
                                                    grammar::GrammarCache& cache) {
  if (!rf.is_object()) throw invalid_param("response_format", "'response_format' must be an object");
  const nlohmann::json* type = find_field(rf, "type");
  if (type == nullptr || !type->is_string())
    throw invalid_param("response_format", "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
  if (*type == "text") return nullptr;
  if (*type == "json_object") {
    if (const nlohmann::json* schema = find_field(rf, "schema"))
      return from_schema(*schema, ordered, {"response_format", "schema"}, "response_format.schema", cache);
    return compile(grammar::json_object_gbnf(), "response_format", "grammar", cache);
  }
  if (*type == "json_schema") {
    const nlohmann::json* js = find_field(rf, "json_schema");
    if (js == nullptr || !js->is_object())
      throw invalid_param("response_format.json_schema", "'response_format.json_schema' must be an object with a 'schema'");
    if (const nlohmann::json* name = find_field(*js, "name"); name != nullptr && !name->is_string())
      throw invalid_param("response_format.json_schema.name", "'response_format.json_schema.name' must be a string");
    if (const nlohmann::json* strict = find_field(*js, "strict"); strict != nullptr && !strict->is_boolean())
      throw invalid_param("response_format.json_schema.strict", "'response_format.json_schema.strict' must be a boolean");
    const nlohmann::json* schema = find_field(*js, "schema");
    if (schema == nullptr)
      throw invalid_param("response_format.json_schema.schema", "'response_format.json_schema.schema' is required");
    return from_schema(*schema, ordered, {"response_format", "json_schema", "schema"},
                       "response_format.json_schema.schema", cache);
  }
  throw invalid_param("response_format", "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", got \"" +
                                             type->get<std::string>() + "\"");
}

}  // namespace

std::shared_ptr<const Grammar> parse_output_grammar(const nlohmann::json& body, const nlohmann::ordered_json* ordered,
                                                    grammar::GrammarCache& cache) {
  const nlohmann::json* rf = find_field(body, "response_format");
  const nlohmann::json* gbnf = find_field(body, "grammar");
  const nlohmann::json* schema = find_field(body, "json_schema");
  if (gbnf != nullptr && gbnf->is_null()) gbnf = nullptr;
  if (schema != nullptr && schema->is_null()) schema = nullptr;
  // {"type": "text"} is the default some clients always send: it constrains nothing, so it
  // does not conflict with `grammar` or `json_schema`.
  if (rf != nullptr && (rf->is_null() || (rf->is_object() && rf->contains("type") && (*rf)["type"] == "text"))) rf = nullptr;
  if (int(rf != nullptr) + int(gbnf != nullptr) + int(schema != nullptr) > 1)
    throw invalid_param(gbnf != nullptr ? "grammar" : "json_schema",
                        "give at most one of 'response_format', 'grammar' and 'json_schema'");
  if (rf != nullptr) return from_response_format(*rf, ordered, cache);
  if (gbnf != nullptr) {
    if (!gbnf->is_string()) throw invalid_param("grammar", "'grammar' must be a string of GBNF, got " + json_type_name(*gbnf));
    return compile(gbnf->get<std::string>(), "grammar", "grammar", cache);
  }
  if (schema != nullptr) return from_schema(*schema, ordered, {"json_schema"}, "json_schema", cache);
  return nullptr;
}

}  // namespace fdl::server

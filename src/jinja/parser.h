// parser.h — Jinja template source to its syntax tree, with the whitespace rules chat
// templates are written for (Transformers renders them with trim_blocks and lstrip_blocks):
// `{%- -%}` / `{{- -}}` / `{#- -#}` strip the whitespace beside a tag; the first newline
// after a block or comment tag is dropped; spaces and tabs before a block or comment tag at
// the start of a line are dropped (`{%+` keeps them).
// Statements: if/elif/else, for (with `if` filter, `else`, unpacking), set (names, `ns.attr`,
// tuples, blocks), macro, call, filter, generation (rendered as its body), break, continue.
#pragma once

#include <string_view>

#include "jinja/ast.h"

namespace fdl::jinja {

/// Throws TemplateError naming the line for a syntax error.
Body parse_template(std::string_view source);

}  // namespace fdl::jinja

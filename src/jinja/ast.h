// ast.h — the parsed form of a Jinja template (parser.cpp builds it, render.cpp runs it).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace fdl::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

/// An expression. `kids` holds the operands in source order; for calls, filters and tests the
/// positional arguments follow the callee/subject, and `kw` the keyword arguments.
struct Expr {
  enum class Kind {
    Literal,  // value
    Name,     // name
    Attr,     // kids[0].name
    Item,     // kids[0][kids[1]]
    Slice,    // kids[0][kids[1]:kids[2]:kids[3]] (null parts: absent)
    Call,     // kids[0](kids[1..], kw)
    Filter,   // kids[0] | name(kids[1..], kw)
    Test,     // kids[0] is [not] name(kids[1..]); `negate`
    Not,      // not kids[0]
    Neg,      // -kids[0]
    Pos,      // +kids[0]
    Binary,   // kids[0] op kids[1]
    And,
    Or,
    Cond,     // kids[0] if kids[1] else kids[2] (kids[2] null: undefined)
    List,
    Tuple,
    Dict,     // kids: key, value, key, value, ...
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;  // Name, Attr, Filter, Test; Binary: the operator
  bool negate = false;
  std::vector<ExprPtr> kids;
  std::vector<std::pair<std::string, ExprPtr>> kw;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

/// A statement or piece of output.
struct Node {
  enum class Kind { Text, Output, If, For, Set, SetBlock, Macro, CallBlock, FilterBlock, Break, Continue, Block };
  Kind kind;
  int line = 0;
  std::string text;                  // Text
  ExprPtr expr;                      // Output, For (iterable), Set (value), CallBlock (the call), If: unused
  std::vector<std::pair<ExprPtr, Body>> branches;  // If: condition, body (else: null condition)
  std::vector<std::string> targets;  // For, Set, SetBlock: names (Set: "ns.attr" for a namespace)
  ExprPtr filter;                    // For: `if` clause; FilterBlock / SetBlock: the filter chain applied to a placeholder
  Body body, else_body;              // For, Macro, CallBlock, FilterBlock, SetBlock, Block
  std::string name;                  // Macro
  std::vector<std::pair<std::string, ExprPtr>> params;  // Macro, CallBlock (caller's): name, default
};

}  // namespace fdl::jinja

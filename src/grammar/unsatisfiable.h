// Internal: the error for a schema, or a part of one, that no JSON value satisfies.
#pragma once

#include "flashdllm/grammar.h"

namespace fdl::grammar {

/// A GrammarError saying that nothing matches (minimum above maximum, an enum whose values
/// all fail the other keywords, ...). anyOf/oneOf catch it to drop that alternative; an
/// optional property or array element that cannot be satisfied is left out.
class Unsatisfiable : public GrammarError {
 public:
  using GrammarError::GrammarError;
};

}  // namespace fdl::grammar

// Lowering of an op spec to the flat schema torch registers, plus the mapping
// tree both front ends use to flatten calls and rebuild structs.
//
//   original: my::attn(Tensor q, AttnCfg cfg, Literal["a", "b"] mode="a") -> Tensor
//   lowered:  my::attn(Tensor q, float cfg__scale, bool cfg__causal, str mode="a") -> Tensor
//   params:   [leaf q -> 0, struct cfg (AttnCfg) [leaf scale -> 1, leaf causal -> 2], leaf mode -> 3]
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/schema.h"
#include "core/structs.h"

namespace opforge {

struct LowerOptions {
  // Names of mutated parameters: an original parameter (a struct expands to
  // its Tensor leaves), a leaf (`cfg__w`) or a field path (`cfg.w`).
  std::vector<std::string> mutates_args;
  // Type names resolve as `scope.Name` first (see ParseOptions::scope).
  std::string scope;
  // See ParseOptions::check_default_types.
  bool check_default_types = false;
};

// What a front end needs to know about one flat argument.
struct LeafInfo {
  std::string path;              // "cfg.inner.bias"; the parameter name at top level
  std::vector<Value> allowed;    // Literal/Enum: the values accepted
  std::string enum_name;         // kEnum leaves: the enum's registered name
  std::string handle_type;       // Handle(T) leaves: T
  bool is_presence = false;      // the `cfg__is_set` leaf of an Optional[Struct]
  bool mutated = false;
  bool default_from_field = false;  // a field default of a required struct
  // Optional in the flat schema only because an enclosing struct is
  // Optional: a caller passing the struct must still give a value.
  bool forced_optional = false;
};

struct MappingNode {
  enum class Kind { kLeaf, kStruct };
  Kind kind = Kind::kLeaf;
  std::string name;         // parameter name, or field name below the top
  int leaf_index = -1;      // kLeaf: index into the flat arguments (or returns)
  std::string struct_name;  // kStruct
  bool optional = false;    // kStruct from Optional[Struct]
  int presence_index = -1;  // kStruct, optional: index of the presence leaf
  std::vector<MappingNode> children;
};

struct LoweredOp {
  FunctionSchema original;
  FunctionSchema flat;
  std::vector<LeafInfo> leaves;          // parallel to flat.arguments
  std::vector<MappingNode> params;       // one per original argument
  std::vector<MappingNode> returns;      // one per original return
  std::vector<std::string> warnings;     // e.g. defaults torch cannot keep

  bool is_identity() const;  // true when nothing needed expanding
};

// Lowers a spec. Errors name the op, the parameter/field and a fix.
LoweredOp Lower(const FunctionSchema& spec, const LowerOptions& options,
                const TypeRegistry& registry = TypeRegistry::Global());
// Parses `spec_text` with extensions enabled, then lowers it. Text that does
// not parse throws a ParseError with the op name before its message.
LoweredOp LowerText(std::string_view spec_text, const LowerOptions& options,
                    const TypeRegistry& registry = TypeRegistry::Global());

// Resolves names (a parameter -- a struct expands to its Tensor leaves --, a
// leaf `cfg__w`, or a field path `cfg.w`) to the indices of flat Tensor
// leaves, sorted. Errors name `option` (e.g. "mutates_args"); `purpose`
// completes "only Tensor arguments ..." (e.g. "can be mutated").
std::vector<int> ResolveTensorLeafIndices(const LoweredOp& op, const std::vector<std::string>& names,
                                          const std::string& option, const std::string& purpose);

// Throws unless `name` has the form "namespace::name".
void CheckOpName(const std::string& name);

// Throws unless `type` can be an op parameter (or a struct field) after
// lowering. `op` and `where` only shape the error message.
void CheckLowerable(const Type& type, const TypeRegistry& registry, const std::string& op, const std::string& where);

}  // namespace opforge

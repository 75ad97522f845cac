// Rotary embedding on the CPU, in place on query and key: each token's heads
// rotated by the cos and sin of its position, GPT-NeoX style (the first and
// second halves of the rotary dims) or GPT-J style (interleaved pairs).
//
//   positions      [num_tokens] int64
//   query          [num_tokens, num_heads * head_size]
//   key            [num_tokens, num_kv_heads * head_size], or None
//   cos_sin_cache  [max_position, rot_dim]: rot_dim / 2 cosines, then as many sines
#include <utility>

#include "../dispatch_utils.h"

namespace vllm_style {
namespace {

template <typename scalar_t, bool IS_NEOX>
void rotate_heads(scalar_t* __restrict__ data, const int64_t token_stride, const int num_heads, const int head_size,
                  const int64_t* __restrict__ positions, const scalar_t* __restrict__ cos_sin_cache,
                  const int rot_dim, const int64_t num_tokens) {
  const int embed_dim = rot_dim / 2;
  for (int64_t token = 0; token < num_tokens; ++token) {
    const scalar_t* cos_ptr = cos_sin_cache + positions[token] * rot_dim;
    const scalar_t* sin_ptr = cos_ptr + embed_dim;
    for (int head = 0; head < num_heads; ++head) {
      scalar_t* head_p = data + token * token_stride + static_cast<int64_t>(head) * head_size;
      for (int j = 0; j < embed_dim; ++j) {
        const int x_index = IS_NEOX ? j : 2 * j;
        const int y_index = IS_NEOX ? embed_dim + j : 2 * j + 1;
        const float cos = static_cast<float>(cos_ptr[j]);
        const float sin = static_cast<float>(sin_ptr[j]);
        const float x = static_cast<float>(head_p[x_index]);
        const float y = static_cast<float>(head_p[y_index]);
        head_p[x_index] = static_cast<scalar_t>(x * cos - y * sin);
        head_p[y_index] = static_cast<scalar_t>(y * cos + x * sin);
      }
    }
  }
}

template <typename scalar_t>
void rotate(Tensor& t, const int head_size, const Tensor& positions, const Tensor& cos_sin_cache, bool is_neox) {
  const int64_t num_tokens = NumRows(t);
  const int num_heads = static_cast<int>(LastDim(t) / head_size);
  const int64_t token_stride = t.dim() > 1 ? t.stride(t.dim() - 2) : LastDim(t);
  const int rot_dim = static_cast<int>(LastDim(cos_sin_cache));
  auto run = is_neox ? &rotate_heads<scalar_t, true> : &rotate_heads<scalar_t, false>;
  run(t.mutable_data_ptr<scalar_t>(), token_stride, num_heads, head_size, positions.const_data_ptr<int64_t>(),
      cos_sin_cache.const_data_ptr<scalar_t>(), rot_dim, num_tokens);
}

}  // namespace

void rotary_embedding(Tensor& positions, Tensor& query, std::optional<Tensor> key, int64_t head_size,
                      Tensor& cos_sin_cache, bool is_neox) {
  VLLM_STYLE_CHECK(head_size > 0 && LastDim(query) % head_size == 0,
                   "rotary_embedding: query's last dimension must be a multiple of head_size");
  VLLM_STYLE_CHECK(LastDim(cos_sin_cache) <= head_size, "rotary_embedding: rot_dim must be at most head_size");
  VLLM_STYLE_CHECK(positions.numel() == NumRows(query), "rotary_embedding: one position per token");
  VLLM_STYLE_CHECK(query.stride(query.dim() - 1) == 1, "rotary_embedding: query's last dimension must be dense");
  VLLM_STYLE_CHECK(cos_sin_cache.is_contiguous() && cos_sin_cache.scalar_type() == query.scalar_type(),
                   "rotary_embedding: cos_sin_cache must be contiguous, of query's dtype");
  DispatchFloatingTypes(query.scalar_type(), "rotary_embedding", [&](auto tag) {
    using scalar_t = decltype(tag);
    rotate<scalar_t>(query, static_cast<int>(head_size), positions, cos_sin_cache, is_neox);
    if (key.has_value()) {
      VLLM_STYLE_CHECK(key->stride(key->dim() - 1) == 1 && NumRows(*key) == NumRows(query),
                       "rotary_embedding: key must have query's tokens and a dense last dimension");
      rotate<scalar_t>(*key, static_cast<int>(head_size), positions, cos_sin_cache, is_neox);
    }
  });
}

namespace with_cfg {

void rotary_embedding(Tensor& positions, Tensor& query, std::optional<Tensor> key, Tensor& cos_sin_cache,
                      const RopeCfg& cfg) {
  vllm_style::rotary_embedding(positions, query, std::move(key), cfg.head_size, cos_sin_cache, cfg.is_neox);
}

}  // namespace with_cfg

}  // namespace vllm_style

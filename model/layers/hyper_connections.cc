#include "model/layers/hyper_connections.h"

#include "common/status_macros.h"

namespace mneme::model {
namespace {

absl::StatusOr<HcWeights> LoadHc(WeightLoader& load, const std::string& prefix,
                                 int64_t rows, int64_t scales,
                                 const ModelDims& dims) {
  HcWeights w;
  const int64_t hc = dims.hc_mult, D = dims.hidden_size;
  ASSIGN_OR_RETURN(w.fn, load.FloatMatrix(prefix + "_fn", rows, hc * D));
  ASSIGN_OR_RETURN(w.base, load.Vector(prefix + "_base", {rows}));
  ASSIGN_OR_RETURN(w.scale, load.Vector(prefix + "_scale", {scales}));
  return w;
}

}  // namespace

absl::StatusOr<HcWeights> LoadHcSublayerWeights(WeightLoader& load,
                                                const std::string& prefix,
                                                const ModelDims& dims) {
  const int64_t hc = dims.hc_mult;
  return LoadHc(load, prefix, (2 + hc) * hc, 3, dims);
}

absl::StatusOr<HcWeights> LoadHcHeadWeights(WeightLoader& load,
                                            const ModelDims& dims,
                                            const std::string& prefix) {
  return LoadHc(load, prefix + "hc_head", dims.hc_mult, 1, dims);
}

absl::StatusOr<HcScratch> TakeHcScratch(Workspace& workspace, int64_t tokens,
                                        const ModelDims& dims) {
  const int64_t hc = dims.hc_mult;
  HcScratch s;
  ASSIGN_OR_RETURN(s.x, workspace.Take(tokens * dims.hidden_size));
  ASSIGN_OR_RETURN(s.pre, workspace.Take(tokens * hc));
  ASSIGN_OR_RETURN(s.post, workspace.Take(tokens * hc));
  ASSIGN_OR_RETURN(s.comb, workspace.Take(tokens * hc * hc));
  return s;
}

void HcMix(const LayerContext& ctx, const HcWeights& w,
           gpu::ConstMatrixView stream, const HcScratch& scratch) {
  const ModelDims& d = ctx.dims;
  const int64_t T = stream.rows, hc = d.hc_mult;
  ctx.backend.HcMix(stream, *w.fn, w.base->data(), w.scale->data(),
                    static_cast<int>(hc), d.hc_sinkhorn_iters, d.hc_eps,
                    d.rms_norm_eps, scratch.pre.view(T, hc),
                    scratch.post.view(T, hc), scratch.comb.view(T, hc * hc));
}

gpu::MatrixView HcCollapse(const LayerContext& ctx, gpu::ConstMatrixView stream,
                           gpu::ConstMatrixView pre, const HcScratch& scratch) {
  const int64_t T = stream.rows;
  const gpu::MatrixView x = scratch.x.view(T, ctx.dims.hidden_size);
  ctx.backend.HcCollapse(stream, pre, ctx.dims.hc_mult, x);
  return x;
}

void HcPost(const LayerContext& ctx, gpu::ConstMatrixView a,
            const HcScratch& scratch, gpu::MatrixView stream) {
  const int64_t T = stream.rows, hc = ctx.dims.hc_mult;
  ctx.backend.HcPost(a, scratch.post.view(T, hc), scratch.comb.view(T, hc * hc),
                     static_cast<int>(hc), stream);
}

void HcHead(const LayerContext& ctx, const HcWeights& w,
            gpu::ConstMatrixView xs, gpu::MatrixView x) {
  const int64_t hc = ctx.dims.hc_mult;
  ctx.backend.HcHead(xs, *w.fn, w.base->data(), w.scale->data(),
                     static_cast<int>(hc), ctx.dims.hc_eps, x);
}

}  // namespace mneme::model

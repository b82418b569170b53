// Fused RNN cells. PyTorch's LSTM and GRU cells take a fused path on every
// device but the CPU (RNN.cpp: input.is_cuda() || is_xpu() || is_privateuseone()),
// calling kernels that only CUDA provides. The device provides them here,
// with CUDA's semantics: the cell's element-wise math in one op, the
// activated gates kept as the workspace for backward. Because the fused path
// adds the biases after the matmuls (the CPU path folds them into addmm),
// results differ from CPU eager in the last bits, as they do on CUDA.
#include "runtime.h"

#include <torch/library.h>

namespace neuron_emu {
namespace {

at::Tensor with_biases(const at::Tensor& gates, const std::optional<at::Tensor>& bias) {
  return bias.has_value() && bias->defined() ? gates + *bias : gates;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell(const at::Tensor& input_gates,
                                                               const at::Tensor& hidden_gates, const at::Tensor& cx,
                                                               const std::optional<at::Tensor>& input_bias,
                                                               const std::optional<at::Tensor>& hidden_bias) {
  auto gates = with_biases(with_biases(input_gates + hidden_gates, input_bias), hidden_bias);
  auto chunks = gates.chunk(4, 1);
  auto i = chunks[0].sigmoid(), f = chunks[1].sigmoid(), c = chunks[2].tanh(), o = chunks[3].sigmoid();
  auto cy = f * cx + i * c;
  auto hy = o * cy.tanh();
  return {hy, cy, at::cat({i, f, c, o}, 1)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell_backward(const std::optional<at::Tensor>& grad_hy,
                                                                        const std::optional<at::Tensor>& grad_cy,
                                                                        const at::Tensor& cx, const at::Tensor& cy,
                                                                        const at::Tensor& workspace, bool has_bias) {
  auto w = workspace.chunk(4, 1);
  auto &i = w[0], &f = w[1], &c = w[2], &o = w[3];
  auto tanh_cy = cy.tanh();
  auto ghy = grad_hy.has_value() && grad_hy->defined() ? *grad_hy : at::zeros_like(cy);
  auto gcy = ghy * o * (1 - tanh_cy * tanh_cy);
  if (grad_cy.has_value() && grad_cy->defined()) gcy = gcy + *grad_cy;
  auto gi = gcy * c * i * (1 - i);
  auto gf = gcy * cx * f * (1 - f);
  auto gc = gcy * i * (1 - c * c);
  auto go = ghy * tanh_cy * o * (1 - o);
  auto grad_gates = at::cat({gi, gf, gc, go}, 1);
  auto grad_bias = has_bias ? grad_gates.sum(0) : at::Tensor();
  return {grad_gates, gcy * f, grad_bias};
}

std::tuple<at::Tensor, at::Tensor> fused_gru_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                                  const at::Tensor& hx, const std::optional<at::Tensor>& input_bias,
                                                  const std::optional<at::Tensor>& hidden_bias) {
  auto ig = with_biases(input_gates, input_bias).chunk(3, 1);
  auto hg = with_biases(hidden_gates, hidden_bias).chunk(3, 1);
  auto r = (ig[0] + hg[0]).sigmoid();
  auto z = (ig[1] + hg[1]).sigmoid();
  auto n = (ig[2] + r * hg[2]).tanh();
  auto hy = (hx - n) * z + n;
  return {hy, at::cat({r, z, n, hx, hg[2]}, 1)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  auto w = workspace.chunk(5, 1);
  auto &r = w[0], &z = w[1], &n = w[2], &hx = w[3], &hn = w[4];
  auto gz = grad_hy * (hx - n) * z * (1 - z);
  auto gn = grad_hy * (1 - z) * (1 - n * n);
  auto gr = gn * hn * r * (1 - r);
  auto grad_input_gates = at::cat({gr, gz, gn}, 1);
  auto grad_hidden_gates = at::cat({gr, gz, gn * r}, 1);
  at::Tensor gib, ghb;
  if (has_bias) {
    gib = grad_input_gates.sum(0);
    ghb = grad_hidden_gates.sum(0);
  }
  return {grad_input_gates, grad_hidden_gates, grad_hy * z, gib, ghb};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", fused_lstm_cell);
  m.impl("_thnn_fused_lstm_cell_backward_impl", fused_lstm_cell_backward);
  m.impl("_thnn_fused_gru_cell", fused_gru_cell);
  m.impl("_thnn_fused_gru_cell_backward", fused_gru_cell_backward);
}

}  // namespace neuron_emu

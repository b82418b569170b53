// The host-copy watch's recorder: every host<->device copy dispatched while it is on, with the chain of calls
// above it on its thread.
//
// conformance/host_copies.py decides which op a copy belongs to from that chain. PyTorch's execution trace
// gives the same chain, but it writes every dispatched op with all its arguments to a JSON file (about 12 us
// an op); a model whose grouped convolutions dispatch 875,000 ops spent seconds in it. This recorder keeps
// only a stack of (id, name) per thread and copies out the chain of the rare copy that crosses devices: the
// same nodes the execution trace holds for it, read by the same Python code.
#include <ATen/record_function.h>
#include <c10/core/DeviceType.h>
#include <torch/extension.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace {

struct Frame {
  int64_t id;
  int64_t parent;
  const char* name;  // owned by the RecordFunction, which outlives its frame
  std::vector<std::string> devices;  // of a copy's tensor arguments; empty for every other op
};

struct Node {
  std::string name;
  int64_t parent;
  std::vector<std::string> devices;
};

// One recording at a time, process-wide (the callback is global: autograd's device threads run backward ops).
std::atomic<int64_t> g_session{0};
std::atomic<int64_t> g_next_id{1};
std::mutex g_mutex;
std::map<int64_t, Node> g_nodes;  // copies across devices and every call above them, by id
std::atomic<bool> g_active{false};
at::CallbackHandle g_handle = 0;

struct ThreadStack {
  int64_t session = -1;
  std::vector<Frame> frames;
};
thread_local ThreadStack t_stack;

struct FrameContext : at::ObserverContext {
  explicit FrameContext(int64_t id) : id(id) {}
  int64_t id;
};

bool is_copy(const char* name) {
  return std::strcmp(name, "aten::copy_") == 0 || std::strcmp(name, "aten::_copy_from") == 0 ||
         std::strcmp(name, "aten::_copy_from_and_resize") == 0;
}

std::vector<std::string> tensor_devices(const at::RecordFunction& fn) {
  std::vector<std::string> devices;
  for (const c10::IValue& value : fn.inputs()) {
    if (value.isTensor() && value.toTensor().defined()) {
      devices.push_back(c10::DeviceTypeName(value.toTensor().device().type(), /*lower_case=*/true));
    }
  }
  return devices;
}

bool crosses_host(const std::vector<std::string>& devices) {
  bool host = false, other = false;
  for (const auto& d : devices) (d == "cpu" ? host : other) = true;
  return host && other;
}

ThreadStack& stack_now() {
  const int64_t session = g_session.load(std::memory_order_relaxed);
  if (t_stack.session != session) {  // frames left by an earlier recording, or by a thread it never saw end
    t_stack.session = session;
    t_stack.frames.clear();
  }
  return t_stack;
}

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  if (!g_active.load(std::memory_order_relaxed)) return nullptr;
  ThreadStack& stack = stack_now();
  const char* name = fn.name();
  Frame frame{g_next_id.fetch_add(1, std::memory_order_relaxed),
              stack.frames.empty() ? 0 : stack.frames.back().id, name, {}};
  if (is_copy(name)) {
    frame.devices = tensor_devices(fn);
    if (crosses_host(frame.devices)) {
      std::lock_guard<std::mutex> lock(g_mutex);
      g_nodes.try_emplace(frame.id, Node{name, frame.parent, frame.devices});
      for (const Frame& above : stack.frames) g_nodes.try_emplace(above.id, Node{above.name, above.parent, above.devices});
    }
  }
  auto context = std::make_unique<FrameContext>(frame.id);
  stack.frames.push_back(std::move(frame));
  return context;
}

void on_exit(const at::RecordFunction&, at::ObserverContext* context) {
  if (context == nullptr) return;
  const int64_t id = static_cast<FrameContext*>(context)->id;
  ThreadStack& stack = stack_now();
  // Pop down to this call's frame: a frame above it whose exit was never seen (an op that started while the
  // recorder was off) must not become the parent of what follows.
  for (size_t i = stack.frames.size(); i-- > 0;) {
    if (stack.frames[i].id == id) {
      stack.frames.resize(i);
      break;
    }
  }
}

void start() {
  TORCH_CHECK(!g_active.load(), "the host-copy recorder is already recording");
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_nodes.clear();
  }
  g_session.fetch_add(1);
  g_handle = at::addGlobalCallback(at::RecordFunctionCallback(on_enter, on_exit).needsInputs(true));
  g_active.store(true);
}

// (id, name, parent id, devices) of every recorded node; a parent id of 0, or one not listed, is the top.
std::vector<std::tuple<int64_t, std::string, int64_t, std::vector<std::string>>> stop() {
  TORCH_CHECK(g_active.load(), "the host-copy recorder is not recording");
  g_active.store(false);
  at::removeCallback(g_handle);
  g_handle = 0;
  g_session.fetch_add(1);
  std::vector<std::tuple<int64_t, std::string, int64_t, std::vector<std::string>>> nodes;
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& [id, node] : g_nodes) nodes.emplace_back(id, std::move(node.name), node.parent, std::move(node.devices));
  g_nodes.clear();
  return nodes;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Records host<->device copies and the calls above them (conformance/host_copies.py reads them).";
  m.def("start", &start, "Starts recording on every thread.");
  m.def("stop", &stop, "Stops recording; returns (id, name, parent, devices) of each copy across devices and its callers.");
}

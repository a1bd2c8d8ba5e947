// qmoe._qmoe: the Python binding (nanobind) over the public C++ API (include/qmoe/). It converts
// arguments, checks what only Python can get wrong (array layout, dtype, device) and calls the
// library; every other check and every computation is the library's.
//
// Tensors come in through DLPack / the buffer protocol (nb::ndarray): 2-D, row-major contiguous,
// bfloat16 / float16 / float32. Host tensors: float32 is read in place; bfloat16 / float16 are
// widened to float32 (exact) by qmoe::to_f32; outputs are new arrays of the input's framework.
// CUDA tensors (PyTorch, CuPy) on a layer opened for that GPU go through cuda::CudaLayer: read in
// place in their dtype, outputs allocated by the caller's framework on its device, the work queued
// on the caller's current stream (no host round trip, capturable in a CUDA graph).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "qmoe/config.h"
#include "qmoe/error.h"
#include "qmoe/inspect.h"
#include "qmoe/moe.h"
#include "qmoe/quantizer.h"
#include "qmoe/schemes.h"
#include "qmoe/tensor.h"
#ifdef QMOE_HAVE_CUDA
#include "qmoe/cuda.h"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace qmoe::python {

namespace {

std::string shape_text(const int64_t* shape, size_t ndim) {
  std::string s = "[";
  for (size_t i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ---- tensors in ------------------------------------------------------------------------------

enum class Framework { NumPy, PyTorch, Jax, CuPy };

// The framework an output goes back as: the one the input came from (NumPy for anything else
// that speaks the buffer protocol or DLPack).
Framework framework_of(nb::handle obj) {
  const nb::object mod = nb::getattr(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr()))), "__module__", nb::none());
  if (!nb::isinstance<nb::str>(mod)) return Framework::NumPy;
  const std::string m = nb::cast<std::string>(mod);
  if (m.rfind("torch", 0) == 0) return Framework::PyTorch;
  if (m.rfind("jax", 0) == 0) return Framework::Jax;
  if (m.rfind("cupy", 0) == 0) return Framework::CuPy;
  return Framework::NumPy;
}

// A 2-D tensor as the library reads it (host or device memory).
struct Matrix {
  nb::ndarray<nb::ro> array;  // keeps the caller's memory alive
  DType dtype = DType::F32;
  int64_t rows = 0, cols = 0;
  const void* data = nullptr;
  Framework framework = Framework::NumPy;
  int32_t device_type = nb::device::cpu::value, device_id = 0;
  bool on_cuda() const { return device_type == nb::device::cuda::value; }
};

std::string device_text(const Matrix& m) {
  if (m.device_type == nb::device::cpu::value) return "cpu";
  if (m.on_cuda()) return "cuda:" + std::to_string(m.device_id);
  return "DLPack device type " + std::to_string(m.device_type);
}

// Every tensor's layout check (strides in elements; null: contiguous).
void check_layout(const Matrix& m, const int64_t* st, const char* name) {
  // Row-major contiguous (a stride of a size-1 dimension carries no meaning). qmoe reads the
  // caller's memory in place, so other layouts are refused rather than copied behind the caller's back.
  const bool contiguous = st == nullptr || m.rows == 0 || m.cols == 0 ||
                          ((m.cols <= 1 || st[1] == 1) && (m.rows <= 1 || st[0] == m.cols));
  if (!contiguous) {
    const int64_t shape[2] = {m.rows, m.cols};
    throw Error(std::string(name) + ": the tensor is not row-major contiguous (shape " + shape_text(shape, 2) +
                ", strides " + shape_text(st, 2) + " elements); qmoe reads tensors in place: pass " +
                "numpy.ascontiguousarray(x) or x.contiguous()");
  }
}

// CUDA tensors of PyTorch and CuPy are read from their own attributes rather than through
// __dlpack__(): called without a stream, __dlpack__ makes the legacy default stream wait on the
// caller's current stream (an event), which a CUDA-graph capture on a side stream forbids.
std::optional<Matrix> read_cuda_matrix(nb::handle obj, const char* name, Framework fw) {
  Matrix m;
  m.framework = fw;
  m.device_type = nb::device::cuda::value;
  std::string dt;
  int64_t st[2] = {0, 0};
  if (fw == Framework::PyTorch) {
    if (!nb::hasattr(obj, "is_cuda") || !nb::cast<bool>(obj.attr("is_cuda"))) return std::nullopt;
    if (nb::cast<bool>(obj.attr("requires_grad")))
      throw Error(std::string(name) + ": the tensor requires grad; qmoe layers are inference-only: pass " +
                  "x.detach() (qmoe.torch.MoE does)");
    const auto shape = nb::cast<std::vector<int64_t>>(obj.attr("shape"));
    if (shape.size() != 2)
      throw Error(std::string(name) + ": expected a 2-D tensor; got shape " + shape_text(shape.data(), shape.size()));
    const auto stride = nb::cast<std::vector<int64_t>>(obj.attr("stride")());
    m.rows = shape[0];
    m.cols = shape[1];
    st[0] = stride[0];
    st[1] = stride[1];
    m.device_id = nb::cast<int32_t>(obj.attr("device").attr("index"));
    m.data = reinterpret_cast<const void*>(nb::cast<uintptr_t>(obj.attr("data_ptr")()));
    dt = nb::cast<std::string>(nb::repr(obj.attr("dtype")));  // "torch.float32"
    if (dt.rfind("torch.", 0) == 0) dt = dt.substr(6);
  } else {
    if (!nb::hasattr(obj, "__cuda_array_interface__")) return std::nullopt;
    const nb::dict cai = nb::cast<nb::dict>(obj.attr("__cuda_array_interface__"));
    const auto shape = nb::cast<std::vector<int64_t>>(cai["shape"]);
    if (shape.size() != 2)
      throw Error(std::string(name) + ": expected a 2-D tensor; got shape " + shape_text(shape.data(), shape.size()));
    m.rows = shape[0];
    m.cols = shape[1];
    const std::string ts = nb::cast<std::string>(cai["typestr"]);
    const int64_t item = ts.size() >= 3 ? std::stoll(ts.substr(2)) : 0;
    dt = ts == "<f4" ? "float32" : ts == "<f2" ? "float16" : ts;
    st[0] = m.cols;
    st[1] = 1;
    if (cai.contains("strides") && !cai["strides"].is_none() && item > 0) {
      const auto bst = nb::cast<std::vector<int64_t>>(cai["strides"]);
      st[0] = bst[0] / item;
      st[1] = bst[1] / item;
    }
    m.data = reinterpret_cast<const void*>(nb::cast<uintptr_t>(nb::cast<nb::tuple>(cai["data"])[0]));
    m.device_id = nb::cast<int32_t>(obj.attr("device").attr("id"));
  }
  if (dt == "float32")
    m.dtype = DType::F32;
  else if (dt == "bfloat16")
    m.dtype = DType::BF16;
  else if (dt == "float16")
    m.dtype = DType::F16;
  else
    throw Error(std::string(name) + ": dtype " + dt + " is not supported; expected bfloat16, float16 or float32");
  check_layout(m, st, name);
  return m;
}

Matrix read_matrix(nb::handle obj, const char* name) {
  Matrix m;
  m.framework = framework_of(obj);
  if (m.framework == Framework::PyTorch || m.framework == Framework::CuPy)
    if (auto cm = read_cuda_matrix(obj, name, m.framework)) return *cm;
  nb::object src = nb::borrow(obj);
  bool bf16_bits = false;
  // NumPy has no bfloat16 of its own: ml_dtypes' bfloat16 is not exported through DLPack or the
  // buffer protocol, so its bits are read as uint16 (a view, no copy).
  if (m.framework == Framework::NumPy && nb::hasattr(obj, "dtype") && nb::hasattr(obj, "view")) {
    const nb::object dt = obj.attr("dtype");
    if (nb::hasattr(dt, "name") && nb::isinstance<nb::str>(dt.attr("name")) &&
        nb::cast<std::string>(dt.attr("name")) == "bfloat16") {
      src = obj.attr("view")("uint16");
      bf16_bits = true;
    }
  }
  if (m.framework == Framework::PyTorch && nb::hasattr(obj, "requires_grad") &&
      nb::cast<bool>(obj.attr("requires_grad")))
    throw Error(std::string(name) + ": the tensor requires grad; qmoe layers are inference-only: pass " +
                "x.detach() (qmoe.torch.MoE does)");
  if (!nb::try_cast(src, m.array))
    throw Error(std::string(name) + ": expected a 2-D tensor (NumPy array, PyTorch tensor or anything that speaks " +
                "DLPack or the buffer protocol); got an object of type " +
                nb::cast<std::string>(nb::str(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr()))).attr("__name__"))));
  const auto& a = m.array;
  if (a.ndim() != 2)
    throw Error(std::string(name) + ": expected a 2-D tensor; got shape " + shape_text(a.shape_ptr(), a.ndim()));
  m.device_type = a.device_type();
  m.device_id = a.device_id();
  if (m.device_type != nb::device::cpu::value && !m.on_cuda())
    throw Error(std::string(name) + ": the tensor is on " + device_text(m) +
                "; qmoe reads host tensors and CUDA tensors; move it to the CPU first, e.g. x.cpu()");
  const auto dt = a.dtype();
  if (bf16_bits || dt == nb::dtype<uint16_t>()) {
    if (!bf16_bits)
      throw Error(std::string(name) + ": dtype uint16 is not supported; expected bfloat16, float16 or float32");
    m.dtype = DType::BF16;
  } else if (dt == nb::dtype<float>()) {
    m.dtype = DType::F32;
  } else if (dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) && dt.bits == 16 && dt.lanes == 1) {
    m.dtype = DType::BF16;
  } else if (dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float) && dt.bits == 16 && dt.lanes == 1) {
    m.dtype = DType::F16;
  } else {
    const char* code = dt.code == 0 ? "int" : dt.code == 1 ? "uint" : dt.code == 2 ? "float" : dt.code == 4 ? "bfloat" : "code ";
    throw Error(std::string(name) + ": dtype " + code + (dt.code > 4 ? std::to_string(dt.code) : "") +
                std::to_string(dt.bits) + " is not supported; expected bfloat16, float16 or float32");
  }
  m.rows = static_cast<int64_t>(a.shape(0));
  m.cols = static_cast<int64_t>(a.shape(1));
  check_layout(m, a.stride_ptr(), name);
  m.data = a.data();
  return m;
}

Matrix host_matrix(nb::handle obj, const char* name) {
  Matrix m = read_matrix(obj, name);
  if (m.on_cuda())
    throw Error(std::string(name) + ": the tensor is on " + device_text(m) +
                " but the other inputs are in host memory; pass them all on one device");
  return m;
}

// fp32 values of a host matrix: the caller's memory for float32, an exact widening otherwise.
const float* as_f32(const Matrix& m, std::vector<float>& storage) {
  if (m.dtype == DType::F32) return static_cast<const float*>(m.data);
  storage = to_f32(Tensor::view(m.dtype, {m.rows, m.cols}, m.data, nullptr));
  return storage.data();
}

// ---- tensors out -----------------------------------------------------------------------------

template <class T>
nb::object new_array(std::unique_ptr<T[]> data, int64_t rows, int64_t cols, Framework fw) {
  T* ptr = data.release();
  nb::capsule owner(ptr, [](void* p) noexcept { delete[] static_cast<T*>(p); });
  const size_t shape[2] = {static_cast<size_t>(rows), static_cast<size_t>(cols)};
  switch (fw) {
    case Framework::PyTorch: return nb::ndarray<nb::pytorch, T>(ptr, 2, shape, owner).cast();
    case Framework::Jax: return nb::ndarray<nb::jax, T>(ptr, 2, shape, owner).cast();
    case Framework::CuPy:  // a host array cannot become a CuPy (device) array: NumPy
    case Framework::NumPy: break;
  }
  return nb::ndarray<nb::numpy, T>(ptr, 2, shape, owner).cast();
}

// ---- checkpoint / layer ----------------------------------------------------------------------

struct LayerOutput {
  nb::object output, topk_ids, topk_weights;
};

#ifdef QMOE_HAVE_CUDA
// The layer resident on one GPU. Host tensors reach its experts through MoELayer's runner
// (CudaExperts::run_host: copies in, runs, syncs); CUDA tensors go straight to CudaLayer.
struct CudaState {
  cuda::CudaOptions opt;
  std::unique_ptr<cuda::CudaLayer> layer;
  const ExpertParams* routed = nullptr;
  const ExpertParams* shared = nullptr;
  std::mutex mu;  // both paths share the layer's work buffers
};

nb::object empty_like_device(const Matrix& like, nb::handle like_obj, int64_t rows, int64_t cols, bool int32) {
  const nb::tuple shape = nb::make_tuple(rows, cols);
  if (like.framework == Framework::PyTorch) {
    const nb::module_ torch = nb::module_::import_("torch");
    return torch.attr("empty")(shape, "dtype"_a = torch.attr(int32 ? "int32" : "float32"),
                               "device"_a = like_obj.attr("device"));
  }
  const nb::module_ cupy = nb::module_::import_("cupy");
  const nb::object dev = cupy.attr("cuda").attr("Device")(like.device_id);
  dev.attr("__enter__")();
  nb::object a = cupy.attr("empty")(shape, "dtype"_a = cupy.attr(int32 ? "int32" : "float32"));
  dev.attr("__exit__")(nb::none(), nb::none(), nb::none());
  return a;
}

// The caller's current stream of `like`'s framework on its device.
uintptr_t current_stream(const Matrix& like, nb::handle like_obj) {
  if (like.framework == Framework::PyTorch) {
    const nb::module_ torch = nb::module_::import_("torch");
    return nb::cast<uintptr_t>(torch.attr("cuda").attr("current_stream")(like_obj.attr("device")).attr("cuda_stream"));
  }
  const nb::module_ cupy = nb::module_::import_("cupy");
  const nb::object dev = cupy.attr("cuda").attr("Device")(like.device_id);
  dev.attr("__enter__")();
  const uintptr_t st = nb::cast<uintptr_t>(cupy.attr("cuda").attr("get_current_stream")().attr("ptr"));
  dev.attr("__exit__")(nb::none(), nb::none(), nb::none());
  return st;
}

void* device_pointer(const Matrix& like, nb::handle arr) {
  if (like.framework == Framework::PyTorch) return reinterpret_cast<void*>(nb::cast<uintptr_t>(arr.attr("data_ptr")()));
  return reinterpret_cast<void*>(nb::cast<uintptr_t>(arr.attr("data").attr("ptr")));
}
#endif

class Layer {
 public:
  Layer(std::string dir, int index, std::string device, std::string kernel, int threads,
        std::unique_ptr<MoELayer> layer)
      : dir_(std::move(dir)), index_(index), device_(std::move(device)), kernel_(std::move(kernel)),
        threads_(threads), layer_(std::move(layer)) {}

  LayerOutput call(nb::handle hidden_states, nb::handle router_logits, std::optional<uintptr_t> stream) const {
    const Matrix x = read_matrix(hidden_states, "hidden_states");
    if (x.on_cuda()) return call_cuda(x, hidden_states, router_logits, stream);
    if (stream)
      throw Error("stream: a stream is only taken with CUDA tensors; hidden_states is in host memory");
    const int H = layer_->experts().hidden;
    const int E = layer_->config().num_experts;
    if (x.rows < 1 || x.rows > INT32_MAX)
      throw Error("hidden_states has " + std::to_string(x.rows) + " tokens; expected 1 <= T <= 2147483647");
    if (x.cols != H)
      throw Error("'hidden_states' has hidden size " + std::to_string(x.cols) + "; layer " + std::to_string(index_) +
                  " of " + dir_ + " has hidden_size " + std::to_string(H));
    std::optional<Matrix> logits;
    if (!router_logits.is_none()) {
      logits = host_matrix(router_logits, "router_logits");
      if (logits->rows != x.rows || logits->cols != E)
        throw Error("'router_logits' is [" + std::to_string(logits->rows) + ", " + std::to_string(logits->cols) +
                    "]; expected [" + std::to_string(x.rows) + ", " + std::to_string(E) + "] (layer " +
                    std::to_string(index_) + " of " + dir_ + " has " + std::to_string(E) + " experts)");
    } else if (!layer_->has_router()) {
      throw Error("router_logits is None and layer " + std::to_string(index_) + " of " + dir_ +
                  " has no router weight (" + layer_->config().router_weight_name(index_) + ")");
    }

    const int T = static_cast<int>(x.rows);
    MoEWorkspace ws;
    auto out = std::make_unique<float[]>(static_cast<size_t>(T) * static_cast<size_t>(H));
    {
      nb::gil_scoped_release release;
      std::vector<float> xs, ls;
      const float* xf = as_f32(x, xs);
      if (logits)
        layer_->plan(as_f32(*logits, ls), T, ws);
      else
        layer_->plan_from_hidden(xf, T, ws);
      layer_->run(xf, ws, out.get());
    }
    const int K = ws.K;
    auto ids = std::make_unique<int32_t[]>(static_cast<size_t>(T) * K);
    auto w = std::make_unique<float[]>(static_cast<size_t>(T) * K);
    std::memcpy(ids.get(), ws.topk_ids.data(), sizeof(int32_t) * static_cast<size_t>(T) * K);
    std::memcpy(w.get(), ws.topk_weights.data(), sizeof(float) * static_cast<size_t>(T) * K);
    return LayerOutput{new_array(std::move(out), T, H, x.framework), new_array(std::move(ids), T, K, x.framework),
                       new_array(std::move(w), T, K, x.framework)};
  }

  // Sizes the device work buffers for up to `max_tokens` tokens (before capturing a CUDA graph).
  void reserve(int max_tokens) {
#ifdef QMOE_HAVE_CUDA
    if (cuda) {
      nb::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(cuda->mu);
      cuda->layer->reserve(max_tokens);
      return;
    }
#endif
    if (max_tokens < 1) throw Error("reserve: max_tokens must be >= 1, got " + std::to_string(max_tokens));
  }

  const MoELayer& layer() const { return *layer_; }
  int index() const { return index_; }
  const std::string& device() const { return device_; }
  const std::string& kernel() const { return kernel_; }
  int threads() const { return threads_; }
  bool bf16_activations() const { return layer_->options().bf16_activations; }
  const std::string& dir() const { return dir_; }

#ifdef QMOE_HAVE_CUDA
  std::shared_ptr<CudaState> cuda;
#endif

 private:
  std::string where() const { return "layer " + std::to_string(index_) + " of " + dir_; }

  // CUDA tensors: the whole layer on the device, on the caller's stream.
  LayerOutput call_cuda(const Matrix& x, nb::handle x_obj, nb::handle router_logits,
                        std::optional<uintptr_t> stream) const {
#ifdef QMOE_HAVE_CUDA
    if (!cuda)
      throw Error("hidden_states is on " + device_text(x) + " but " + where() + " was opened with device='" + device_ +
                  "'; open it with device='" + device_text(x) + "' to run on device tensors, or pass host tensors "
                  "(x.cpu())");
    const cuda::CudaLayer& L = *cuda->layer;
    if (x.device_id != L.device())
      throw Error("hidden_states is on " + device_text(x) + " but " + where() + " lives on cuda:" +
                  std::to_string(L.device()));
    if (x.framework != Framework::PyTorch && x.framework != Framework::CuPy)
      throw Error("hidden_states: CUDA tensors are taken from PyTorch or CuPy (their outputs are allocated by that "
                  "framework); got an object of another framework: wrap it with torch.from_dlpack(x)");
    const int H = L.hidden(), E = L.num_experts(), K = L.top_k();
    if (x.rows < 1 || x.rows > INT32_MAX)
      throw Error("hidden_states has " + std::to_string(x.rows) + " tokens; expected 1 <= T <= 2147483647");
    if (x.cols != H)
      throw Error("'hidden_states' has hidden size " + std::to_string(x.cols) + "; " + where() + " has hidden_size " +
                  std::to_string(H));
    std::optional<Matrix> logits;
    if (!router_logits.is_none()) {
      logits = read_matrix(router_logits, "router_logits");
      if (!logits->on_cuda() || logits->device_id != x.device_id)
        throw Error("router_logits is on " + device_text(*logits) + " but hidden_states is on " + device_text(x) +
                    "; pass both on one device");
      if (logits->rows != x.rows || logits->cols != E)
        throw Error("'router_logits' is [" + std::to_string(logits->rows) + ", " + std::to_string(logits->cols) +
                    "]; expected [" + std::to_string(x.rows) + ", " + std::to_string(E) + "] (" + where() + " has " +
                    std::to_string(E) + " experts)");
    } else if (!L.has_router()) {
      throw Error("router_logits is None and " + where() + " has no router weight (" +
                  layer_->config().router_weight_name(index_) + ")");
    }
    const int T = static_cast<int>(x.rows);
    const uintptr_t st = stream ? *stream : current_stream(x, x_obj);
    nb::object out = empty_like_device(x, x_obj, T, H, false);
    nb::object ids = empty_like_device(x, x_obj, T, K, true);
    nb::object w = empty_like_device(x, x_obj, T, K, false);
    float* d_out = static_cast<float*>(device_pointer(x, out));
    int32_t* d_ids = static_cast<int32_t*>(device_pointer(x, ids));
    float* d_w = static_cast<float*>(device_pointer(x, w));
    {
      nb::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(cuda->mu);
      L.run_device(x.data, x.dtype, T, logits ? logits->data : nullptr, logits ? logits->dtype : DType::F32, d_out,
                   d_ids, d_w, reinterpret_cast<void*>(st));
    }
    return LayerOutput{out, ids, w};
#else
    (void)x_obj;
    (void)router_logits;
    (void)stream;
    throw Error("hidden_states is on " + device_text(x) + ": this qmoe was built without CUDA (reinstall with "
                "QMOE_CUDA=ON, see the README); pass host tensors (x.cpu())");
#endif
  }

  std::string dir_;
  int index_;
  std::string device_, kernel_;
  int threads_;
  std::unique_ptr<MoELayer> layer_;
};

// "cpu" → -1; "cuda" → 0; "cuda:N" → N.
int parse_device(const std::string& device) {
  if (device == "cpu") return -1;
  if (device == "cuda") return 0;
  if (device.rfind("cuda:", 0) == 0 && device.size() > 5 && device.size() < 9 &&
      device.find_first_not_of("0123456789", 5) == std::string::npos)
    return std::stoi(device.substr(5));
  throw Error("device '" + device + "' is not supported; expected 'cpu', 'cuda' or 'cuda:N'");
}

struct PyCheckpoint {
  std::string dir;
  ModelConfig cfg;

  static PyCheckpoint open(const std::filesystem::path& path) {
    PyCheckpoint c;
    c.dir = path.string();
    c.cfg = ModelConfig::load(c.dir);
    return c;
  }

  std::unique_ptr<Layer> layer(int index, const std::string& device, const std::string& kernel,
                               std::optional<int> threads, std::pair<int, int> tp, std::pair<int, int> ep,
                               bool bf16_activations) const {
    const int gpu = parse_device(device);
    MoELayerOptions opt;
    opt.bf16_activations = bf16_activations;
    if (kernel == "optimized")
      opt.kernel = Kernel::Optimized;
    else if (kernel == "reference")
      opt.kernel = Kernel::Reference;
    else
      throw Error("kernel '" + kernel + "' is not supported; expected 'optimized' or 'reference'");
    if (threads && *threads < 1)
      throw Error("threads must be >= 1 (or None: all hardware threads), got " + std::to_string(*threads));
    opt.threads = threads.value_or(0);
    opt.load.tp_rank = tp.first;
    opt.load.tp_size = tp.second;
    opt.load.ep_rank = ep.first;
    opt.load.ep_size = ep.second;
#ifdef QMOE_HAVE_CUDA
    std::shared_ptr<CudaState> cs;
    if (gpu >= 0) {
      if (!cuda::available()) throw Error("device '" + device + "': no CUDA device is visible; use device='cpu'");
      if (gpu >= cuda::device_count())
        throw Error("device '" + device + "': only " + std::to_string(cuda::device_count()) + " CUDA device(s) visible");
      cs = std::make_shared<CudaState>();
      cs->opt.device = gpu;
      cs->opt.bf16_activations = bf16_activations;
      opt.runner = [cs](const ExpertsArgs& a) {
        std::lock_guard<std::mutex> lock(cs->mu);
        // Device calls on other streams may still be using the layer's work buffers.
        if (cs->layer) cs->layer->synchronize();
        if (cs->layer && a.params == cs->routed)
          cs->layer->experts().run_host(a);
        else if (cs->layer && a.params == cs->shared && cs->layer->shared_expert())
          cs->layer->shared_expert()->run_host(a);
        else
          cuda::experts_cuda(a, cs->opt);
      };
    }
#else
    if (gpu >= 0)
      throw Error("device '" + device + "': this qmoe was built without CUDA (reinstall with QMOE_CUDA=ON, " +
                  "see the README); use device='cpu'");
#endif
    std::unique_ptr<MoELayer> ml;
    {
      nb::gil_scoped_release release;
      ml = std::make_unique<MoELayer>(MoELayer::from_checkpoint(dir, index, opt));
#ifdef QMOE_HAVE_CUDA
      if (cs) {
        cs->layer = std::make_unique<cuda::CudaLayer>(*ml, cs->opt);
        cs->routed = &ml->experts();
        if (ml->shared_expert()) cs->shared = &*ml->shared_expert();
      }
#endif
    }
    auto l = std::make_unique<Layer>(dir, index, device, kernel, opt.threads, std::move(ml));
#ifdef QMOE_HAVE_CUDA
    l->cuda = cs;
#endif
    return l;
  }
};

nb::object parse_json(const std::string& text) { return nb::module_::import_("json").attr("loads")(text); }

// The progress callback's Python exception, carried across the library back to the caller.
struct CallbackError {
  std::unique_ptr<nb::python_error> error;
};
struct CallbackAborted : std::exception {
  const char* what() const noexcept override { return "qmoe.quantize: the progress callback raised"; }
};

nb::dict quantize(const std::filesystem::path& src, const std::filesystem::path& dst, const std::string& scheme_name,
                  std::optional<std::filesystem::path> calib, const std::vector<std::string>& exclude,
                  std::optional<int> threads, bool progress,
                  std::function<void(const std::string&, uint64_t, uint64_t)> callback) {
  const SchemeInfo& scheme = scheme_by_name(scheme_name);
  for (const auto& p : exclude) (void)quark_pattern_matches(p, "");  // a bad pattern fails before any work
  if (dst.empty()) throw Error("dst: the output directory is empty; expected a directory name");
  if (threads && *threads < 1)
    throw Error("threads must be >= 1 (or None: all hardware threads), got " + std::to_string(*threads));
  QuantizeOptions opt;
  opt.exclude = exclude;
  if (calib) opt.calib_path = calib->string();
  opt.threads = threads.value_or(0);
  opt.progress = progress;
  auto state = std::make_shared<CallbackError>();
  if (callback) {
    opt.on_progress = [state, callback](const std::string& stage, uint64_t done, uint64_t total) {
      nb::gil_scoped_acquire acquire;
      try {
        if (PyErr_CheckSignals() != 0) throw nb::python_error();  // Ctrl-C stops the job
        callback(stage, done, total);
      } catch (nb::python_error& e) {
        if (!state->error) state->error = std::make_unique<nb::python_error>(std::move(e));
        throw CallbackAborted();
      }
    };
  }
  QuantizeReport r;
  try {
    nb::gil_scoped_release release;
    r = quantize_checkpoint(src.string(), dst.string(), scheme, opt);
  } catch (...) {
    if (state->error) throw nb::python_error(std::move(*state->error));
    throw;
  }
  nb::dict d;
  d["scheme"] = std::string(scheme.name);
  d["quantized_linears"] = r.quantized_linears;
  d["excluded_linears"] = r.excluded_linears;
  d["copied_tensors"] = r.copied_tensors;
  d["shards"] = r.shards;
  d["total_bytes"] = r.total_bytes;
  d["excluded_layers"] = r.excluded_layers;
  d["files"] = r.files;
  return d;
}

}  // namespace

}  // namespace qmoe::python

NB_MODULE(_qmoe, m) {
  using namespace qmoe;
  using namespace qmoe::python;
  m.doc() = "qmoe: Quark-quantized Mixture-of-Experts layers (the C++ library's binding; use the `qmoe` package)";

  m.attr("__version__") = QMOE_VERSION;
  nb::exception<qmoe::Error>(m, "Error", PyExc_RuntimeError);

#ifdef QMOE_HAVE_CUDA
  m.attr("has_cuda") = true;
  m.def("cuda_available", [] { return cuda::available(); }, "True when a CUDA device is visible.");
#else
  m.attr("has_cuda") = false;
  m.def("cuda_available", [] { return false; }, "True when a CUDA device is visible (never: built without CUDA).");
#endif

  m.def(
      "schemes",
      [] {
        std::vector<std::string> names;
        for (const auto& s : all_schemes()) names.emplace_back(s.name);
        return names;
      },
      "The supported scheme names (the registry, in `qmoe schemes` order).");
  m.def(
      "scheme_info",
      [](const std::string& name) {
        const SchemeInfo& s = scheme_by_name(name);
        nb::dict d;
        d["name"] = std::string(s.name);
        d["method"] = std::string(to_string(s.method));
        d["weights"] = std::string(to_string(s.weight));
        d["weight_scale"] = std::string(to_string(s.weight_scale));
        d["activations"] = std::string(to_string(s.act));
        d["bits_per_weight"] = s.bits_per_weight;
        d["description"] = std::string(s.description);
        return d;
      },
      "name"_a, "One registry row (name or alias) as a dict, as `qmoe schemes` prints it.");

  nb::class_<LayerOutput>(m, "LayerOutput", "The result of a layer call.")
      .def_ro("output", &LayerOutput::output, "[T, H] float32: the layer output (this rank's partial sum under TP / EP)")
      .def_ro("topk_ids", &LayerOutput::topk_ids, "[T, K] int32: the selected global expert ids")
      .def_ro("topk_weights", &LayerOutput::topk_weights, "[T, K] float32: their routing weights")
      .def("__iter__",
           [](const LayerOutput& o) { return nb::iter(nb::make_tuple(o.output, o.topk_ids, o.topk_weights)); })
      .def("__repr__", [](const LayerOutput& o) {
        return "LayerOutput(output=" + nb::cast<std::string>(nb::repr(o.output.attr("shape"))) +
               ", topk_ids=" + nb::cast<std::string>(nb::repr(o.topk_ids.attr("shape"))) + ")";
      });

  nb::class_<Layer>(m, "Layer", "One MoE layer loaded (and processed) for a device. Call it on hidden states.")
      .def("__call__", &Layer::call, "hidden_states"_a, "router_logits"_a = nb::none(), nb::kw_only(),
           "stream"_a = nb::none(),
           "out = layer(hidden_states [T, H], router_logits [T, E] or None): hidden states (and logits) are 2-D, "
           "row-major contiguous, bfloat16 / float16 / float32 tensors; without logits the checkpoint's router "
           "computes them. Host tensors: LayerOutput of arrays of the input's framework. CUDA tensors (PyTorch or "
           "CuPy, on the GPU the layer was opened for): read in place, outputs allocated on that device, the work "
           "queued on STREAM (a cudaStream_t as int; None: the framework's current stream) with no host "
           "synchronisation — capturable in a CUDA graph once the layer has run (or reserve()d) that many tokens. "
           "Releases the GIL.")
      .def("reserve", &Layer::reserve, "max_tokens"_a,
           "Size the device work buffers for up to MAX_TOKENS tokens (a CUDA layer allocates; do it before "
           "capturing a CUDA graph). Nothing to do on the CPU.")
      .def_prop_ro("index", &Layer::index, "decoder layer index")
      .def_prop_ro("device", &Layer::device)
      .def_prop_ro("kernel", &Layer::kernel)
      .def_prop_ro("threads", &Layer::threads, "CPU threads (0: all hardware threads)")
      .def_prop_ro("bf16_activations", &Layer::bf16_activations, "activations and intermediate rounded to bf16 (layer(..., bf16_activations=True))")
      .def_prop_ro("scheme", [](const Layer& l) { return std::string(l.layer().experts().scheme->name); })
      .def_prop_ro("hidden_size", [](const Layer& l) { return l.layer().experts().hidden; })
      .def_prop_ro("intermediate_size", [](const Layer& l) { return l.layer().experts().inter; },
                   "this rank's intermediate size (I / tp_size)")
      .def_prop_ro("num_experts", [](const Layer& l) { return l.layer().config().num_experts; })
      .def_prop_ro("num_local_experts", [](const Layer& l) { return l.layer().experts().num_local; })
      .def_prop_ro("top_k", [](const Layer& l) { return l.layer().config().top_k; })
      .def_prop_ro("has_router", [](const Layer& l) { return l.layer().has_router(); })
      .def_prop_ro("warnings", [](const Layer& l) { return l.layer().experts().warnings; })
      .def("__repr__", [](const Layer& l) {
        return "qmoe.Layer(" + l.dir() + ", layer " + std::to_string(l.index()) + ", " +
               std::string(l.layer().experts().scheme->name) + ", device " + l.device() + ", kernel " + l.kernel() + ")";
      });

  nb::class_<PyCheckpoint>(m, "Checkpoint", "A Hugging Face checkpoint directory (config.json + safetensors).")
      .def_static("open", &PyCheckpoint::open, "path"_a, "Read PATH/config.json (the tensors are read by layer()).")
      .def_prop_ro("path", [](const PyCheckpoint& c) { return c.dir; })
      .def_prop_ro("moe_layers", [](const PyCheckpoint& c) { return c.cfg.moe_layers; },
                   "indices of the decoder layers with an MoE block")
      .def_prop_ro("model_type", [](const PyCheckpoint& c) { return c.cfg.model_type; })
      .def_prop_ro("num_layers", [](const PyCheckpoint& c) { return c.cfg.num_layers; })
      .def_prop_ro("hidden_size", [](const PyCheckpoint& c) { return c.cfg.hidden_size; })
      .def_prop_ro("moe_intermediate_size", [](const PyCheckpoint& c) { return c.cfg.moe_intermediate_size; })
      .def_prop_ro("num_experts", [](const PyCheckpoint& c) { return c.cfg.num_experts; })
      .def_prop_ro("top_k", [](const PyCheckpoint& c) { return c.cfg.top_k; })
      .def_prop_ro("quantized", [](const PyCheckpoint& c) { return c.cfg.quant.has_value(); },
                   "whether config.json has a Quark quantization_config")
      .def(
          "inspect",
          [](const PyCheckpoint& c, std::optional<int> layer) {
            std::vector<int> layers;
            if (layer) layers.push_back(*layer);
            std::string text;
            {
              nb::gil_scoped_release release;
              text = inspect_report_json(c.dir, layers, -1);
            }
            return parse_json(text);
          },
          "layer"_a = nb::none(),
          "The `qmoe inspect --json [--layer L]` report as a dict (layer None: every MoE layer).")
      .def("layer", &PyCheckpoint::layer, "index"_a, "device"_a = "cpu", "kernel"_a = "optimized",
           "threads"_a = nb::none(), "tp"_a = std::make_pair(0, 1), "ep"_a = std::make_pair(0, 1),
           "bf16_activations"_a = false,
           "Load and process MoE layer INDEX for DEVICE ('cpu', 'cuda', 'cuda:N'); KERNEL 'optimized' or "
           "'reference' (CPU); THREADS None: all cores; TP / EP = (rank, size); BF16_ACTIVATIONS: schemes "
           "that leave activations unquantized round the input and the intermediate to bf16 once (vLLM's "
           "precision, faster; the optimized CPU kernel and CUDA). Releases the GIL while loading.")
      .def("__repr__", [](const PyCheckpoint& c) {
        std::string layers;
        for (size_t i = 0; i < c.cfg.moe_layers.size(); ++i) layers += (i ? ", " : "") + std::to_string(c.cfg.moe_layers[i]);
        return "qmoe.Checkpoint(" + c.dir + ", " + c.cfg.model_type + ", MoE layers [" + layers + "])";
      });

  m.def("_quantize", &quantize, "src"_a, "dst"_a, "scheme"_a, "calib"_a = nb::none(), "exclude"_a = std::vector<std::string>{},
        "threads"_a = nb::none(), "progress"_a = true, "callback"_a = nb::none(),
        "quantize_checkpoint(): the Python face is qmoe.quantize.");
}

// NCCL communicators (qmoe/cuda_dist.h). Built only with NCCL (QMOE_HAVE_NCCL); without it every
// entry point says so. Point-to-point all-to-all through grouped ncclSend / ncclRecv (NCCL has no
// variable-size all-to-all), sums through ncclAllReduce, host values staged through the device.
#include <fmt/format.h>

#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "cuda/cuda_common.h"
#include "qmoe/cuda_dist.h"
#include "qmoe/error.h"

#ifdef QMOE_HAVE_NCCL
#include <nccl.h>
#endif

namespace qmoe::cuda {

#ifdef QMOE_HAVE_NCCL

namespace {

void check_nccl(ncclResult_t r, const char* what, ncclComm_t comm) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  const char* last = comm ? ncclGetLastError(comm) : nullptr;
  throw Error(fmt::format("NCCL error '{}' in {}{}{}", ncclGetErrorString(r), what, last && *last ? ": " : "",
                          last ? last : ""));
}
#define QMOE_NCCL_CHECK(x, comm) check_nccl((x), #x, (comm))

class NcclComm final : public dist::Communicator {
 public:
  NcclComm(ncclComm_t c, int device) : comm_(c), device_(device) {
    QMOE_NCCL_CHECK(ncclCommUserRank(c, &rank_), c);
    QMOE_NCCL_CHECK(ncclCommCount(c, &size_), c);
  }
  ~NcclComm() override {
    if (comm_) {
      cudaSetDevice(device_);
      ncclCommDestroy(comm_);
    }
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool device_memory() const override { return true; }
  std::string name() const override { return "nccl"; }

  void all_reduce_sum(float* buf, size_t n, void* stream) override {
    live("all_reduce_sum");
    if (n == 0) return;
    QMOE_CUDA_CHECK(cudaSetDevice(device_));
    QMOE_NCCL_CHECK(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, comm_, static_cast<cudaStream_t>(stream)), comm_);
  }

  void all_to_all_v(const void* send, const size_t* send_off, const size_t* send_bytes, void* recv,
                    const size_t* recv_off, const size_t* recv_bytes, void* stream) override {
    live("all_to_all_v");
    QMOE_CUDA_CHECK(cudaSetDevice(device_));
    const auto s = static_cast<cudaStream_t>(stream);
    QMOE_NCCL_CHECK(ncclGroupStart(), comm_);
    for (int p = 0; p < size_; ++p) {
      if (send_bytes[p])
        QMOE_NCCL_CHECK(ncclSend(static_cast<const char*>(send) + send_off[p], send_bytes[p], ncclUint8, p, comm_, s),
                        comm_);
      if (recv_bytes[p])
        QMOE_NCCL_CHECK(ncclRecv(static_cast<char*>(recv) + recv_off[p], recv_bytes[p], ncclUint8, p, comm_, s),
                        comm_);
    }
    QMOE_NCCL_CHECK(ncclGroupEnd(), comm_);
  }

  void exchange_counts(const int64_t* send, int64_t* recv, void* stream) override {
    live("exchange_counts");
    QMOE_CUDA_CHECK(cudaSetDevice(device_));
    const auto s = static_cast<cudaStream_t>(stream);
    const size_t n = static_cast<size_t>(size_);
    int64_t* d = staging_.need<int64_t>(2 * n);
    QMOE_CUDA_CHECK(cudaMemcpyAsync(d, send, n * sizeof(int64_t), cudaMemcpyHostToDevice, s));
    QMOE_NCCL_CHECK(ncclGroupStart(), comm_);
    for (int p = 0; p < size_; ++p) {
      QMOE_NCCL_CHECK(ncclSend(d + p, 1, ncclInt64, p, comm_, s), comm_);
      QMOE_NCCL_CHECK(ncclRecv(d + n + p, 1, ncclInt64, p, comm_, s), comm_);
    }
    QMOE_NCCL_CHECK(ncclGroupEnd(), comm_);
    QMOE_CUDA_CHECK(cudaMemcpyAsync(recv, d + n, n * sizeof(int64_t), cudaMemcpyDeviceToHost, s));
    QMOE_CUDA_CHECK(cudaStreamSynchronize(s));
  }

  void all_gather_host(const void* send, size_t bytes, void* recv) override {
    live("all_gather_host");
    if (bytes == 0) return;
    QMOE_CUDA_CHECK(cudaSetDevice(device_));
    const size_t n = static_cast<size_t>(size_);
    char* d = staging_.need((n + 1) * bytes);
    QMOE_CUDA_CHECK(cudaMemcpy(d, send, bytes, cudaMemcpyHostToDevice));
    QMOE_NCCL_CHECK(ncclAllGather(d, d + bytes, bytes, ncclUint8, comm_, nullptr), comm_);
    QMOE_CUDA_CHECK(cudaMemcpy(recv, d + bytes, n * bytes, cudaMemcpyDeviceToHost));
  }

  void abort(const std::string&) override {
    if (!comm_) return;
    cudaSetDevice(device_);
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  void live(const char* what) const {
    if (!comm_) throw Error(fmt::format("NCCL communicator (rank {} of {}): {} after abort", rank_, size_, what));
  }
  ncclComm_t comm_ = nullptr;
  int device_ = 0, rank_ = 0, size_ = 1;
  GrowBuf staging_;  // host values on their way through NCCL
};

}  // namespace

bool nccl_available() { return true; }

std::string nccl_unique_id() {
  ncclUniqueId id;
  QMOE_NCCL_CHECK(ncclGetUniqueId(&id), nullptr);
  return std::string(id.internal, sizeof(id.internal));
}

std::unique_ptr<dist::Communicator> nccl_communicator(const std::string& unique_id, int nranks, int rank, int device) {
  ncclUniqueId id;
  if (unique_id.size() != sizeof(id.internal))
    throw Error(fmt::format("nccl_communicator: the unique id has {} bytes; expected {} (from nccl_unique_id())",
                            unique_id.size(), sizeof(id.internal)));
  if (nranks < 1 || rank < 0 || rank >= nranks)
    throw Error(fmt::format("nccl_communicator: rank {} of {} is out of range", rank, nranks));
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  QMOE_CUDA_CHECK(cudaSetDevice(device));
  ncclComm_t c = nullptr;
  QMOE_NCCL_CHECK(ncclCommInitRank(&c, nranks, id, rank), nullptr);
  return std::make_unique<NcclComm>(c, device);
}

std::vector<std::unique_ptr<dist::Communicator>> nccl_communicators(const std::vector<int>& devices) {
  if (devices.empty()) throw Error("nccl_communicators: no devices given");
  const int visible = device_count();
  for (int d : devices)
    if (d < 0 || d >= visible)
      throw Error(fmt::format("nccl_communicators: device {} does not exist ({} visible)", d, visible));
  std::vector<ncclComm_t> comms(devices.size());
  QMOE_NCCL_CHECK(ncclCommInitAll(comms.data(), static_cast<int>(devices.size()), devices.data()), nullptr);
  std::vector<std::unique_ptr<dist::Communicator>> out;
  for (size_t i = 0; i < devices.size(); ++i) out.push_back(std::make_unique<NcclComm>(comms[i], devices[i]));
  return out;
}

#else  // no NCCL

bool nccl_available() { return false; }
namespace {
[[noreturn]] void no_nccl() {
  throw Error("this qmoe was built without NCCL (configure with -DQMOE_NCCL=ON and NCCL installed; QMOE_NCCL_ROOT "
              "points at it)");
}
}  // namespace
std::string nccl_unique_id() { no_nccl(); }
std::unique_ptr<dist::Communicator> nccl_communicator(const std::string&, int, int, int) { no_nccl(); }
std::vector<std::unique_ptr<dist::Communicator>> nccl_communicators(const std::vector<int>&) { no_nccl(); }

#endif

}  // namespace qmoe::cuda

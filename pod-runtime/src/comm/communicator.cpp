// The communicator for a backend: Gloo beside the CPU backend, NCCL beside the CUDA backend.
#include "textgen/runtime/communicator.h"

#include <string>

#include "textgen/runtime/backend.h"

namespace textgen::runtime {

StatusOr<std::unique_ptr<Communicator>> makeGlooCommunicator(Rendezvous& rendezvous,
                                                             const std::string& masterAddr,
                                                             const CommunicatorOptions& options);
#ifdef TEXTGEN_HAVE_CUDA
StatusOr<std::unique_ptr<Communicator>> makeNcclCommunicator(Backend& backend,
                                                             Rendezvous& rendezvous,
                                                             const CommunicatorOptions& options);
#endif

Status Communicator::allReduceRmsNorm(Backend& backend, const kernels::RmsNormParams& p) {
  TG_RETURN_IF_ERROR(kernels::validateRmsNorm(p));
  TG_RETURN_IF_ERROR(allReduceSum(const_cast<void*>(p.input), p.numTokens * p.hiddenSize, p.dtype));
  return backend.rmsNorm(p);
}

StatusOr<std::unique_ptr<Communicator>> makeCommunicator(Backend& backend, Rendezvous& rendezvous,
                                                         const CommunicatorOptions& options) {
  const std::string name = backend.name();
  if (name == "cpu") return makeGlooCommunicator(rendezvous, rendezvous.masterAddr(), options);
#ifdef TEXTGEN_HAVE_CUDA
  if (name == "cuda") return makeNcclCommunicator(backend, rendezvous, options);
#endif
  return unimplementedError("no communicator for the " + name + " backend");
}

}  // namespace textgen::runtime

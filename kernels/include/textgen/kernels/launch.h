// How the CUDA kernels are launched, process-wide. Programmatic dependent launch lets each kernel
// of a stream start while the one before it finishes (its blocks wait on the device for that
// kernel's results), hiding the launch gap between the dozens of small kernels of a decode step;
// kernels that stream weights start loading them during the gap. On by default where the device
// supports it (compute capability 9.0 and later); benchmarks turn it off to compare.
#pragma once

namespace textgen::kernels {

// Whether kernels are launched with programmatic dependent launch: the setting, and only on a
// device that supports it (checked once, on the current device at the first call).
bool programmaticLaunch();
void setProgrammaticLaunch(bool on);

}  // namespace textgen::kernels

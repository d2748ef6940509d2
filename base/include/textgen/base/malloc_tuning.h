// Heap settings for the serving processes (glibc malloc). By default glibc gives each allocation of
// 128 KiB and up its own mapping (that bound rises with use, up to 32 MiB) and hands the heap's
// free top back to the kernel past 128 KiB. A request's transient buffers of a few hundred KiB (a
// long prompt's tokens, offsets and merge state) then come back as fresh pages, faulted in one by
// one, on every request: on a 2-core VM that was about two thirds of tokenizing a long prompt
// (bench_tokenizer, Llama 2's tokenizer: 1.7 -> 3.8-5.1 M tokens/s with these settings).
#pragma once

namespace textgen {

// Allocations under 4 MiB stay in the heap and up to 16 MiB of its free top is kept for the next
// ones. A value the environment already sets (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_,
// glibc's own variables) is left as it is. Call once, early in main. Nothing off glibc.
void tuneMallocForServing();

}  // namespace textgen

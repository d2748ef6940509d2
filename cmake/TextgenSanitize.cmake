# Sanitizer and fuzzing builds, each in a build directory of its own (tools/fuzz.sh, docs/fuzzing.md):
#   -DTEXTGEN_SANITIZE=ON  every target with AddressSanitizer + UndefinedBehaviorSanitizer; UB aborts
#                          (-fno-sanitize-recover) so a finding fails the test that hit it.
#   -DTEXTGEN_FUZZ=ON      also instruments for libFuzzer and adds the targets of tests/fuzz; needs
#                          clang (CC=clang-16 CXX=clang++-16). Implies TEXTGEN_SANITIZE.
# Neither builds CUDA code: configure with -DTEXTGEN_CUDA=OFF.
option(TEXTGEN_SANITIZE "Build with AddressSanitizer and UndefinedBehaviorSanitizer" OFF)
option(TEXTGEN_FUZZ "Build the libFuzzer targets of tests/fuzz (clang; implies TEXTGEN_SANITIZE)" OFF)

if(TEXTGEN_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "TEXTGEN_FUZZ needs clang (configure with CC=clang-16 CXX=clang++-16)")
  endif()
  set(TEXTGEN_SANITIZE ON)
endif()

if(TEXTGEN_SANITIZE)
  if(TEXTGEN_HAVE_CUDA)
    message(FATAL_ERROR "TEXTGEN_SANITIZE/TEXTGEN_FUZZ: configure with -DTEXTGEN_CUDA=OFF")
  endif()
  # No vptr check: Debian's libfmt/libspdlog are built without it, and their vtables read as
  # "invalid vptr" from instrumented code (a false report in fmt's buffer, seen when the router
  # logs while out of descriptors), which halts the process under -fno-sanitize-recover.
  set(textgen_san -fsanitize=address,undefined -fno-sanitize=vptr -fno-sanitize-recover=undefined
                  -fno-omit-frame-pointer)
  if(TEXTGEN_FUZZ)
    # Coverage for libFuzzer in every library; only the fuzz targets link libFuzzer's main().
    list(APPEND textgen_san -fsanitize=fuzzer-no-link)
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${textgen_san}>")
  add_link_options(-fsanitize=address,undefined)
  message(STATUS "textgen: ASan+UBSan on; libFuzzer targets: ${TEXTGEN_FUZZ}")
endif()

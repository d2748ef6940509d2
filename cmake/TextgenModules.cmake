# Module targets and the dependency direction between them.
#
#   kernels <- pod-runtime -> proto <- router        operator, launcher: base only
#               pod-runtime -> tracing <- router         (tracing: base, proto)
#               pod-runtime -> tokenizer <- router
#               pod-runtime -> grammar <- router         (grammar: base only)
#
# Every module is a target `textgen_<name>` (alias `textgen::<name>`) whose public headers live in
# `<dir>/include/textgen/<name>/` and are visible only to targets that link it. Executables and tests
# declare the module they belong to and inherit its allowed edges. textgen_check_layering() fails the
# configure step when a link breaks the table below, so a forbidden include cannot even find its header.

set(TEXTGEN_ALLOWED_DEPS_base "")
set(TEXTGEN_ALLOWED_DEPS_proto "")
set(TEXTGEN_ALLOWED_DEPS_kernels "base")
set(TEXTGEN_ALLOWED_DEPS_tokenizer "base")
set(TEXTGEN_ALLOWED_DEPS_grammar "base")
set(TEXTGEN_ALLOWED_DEPS_tracing "base;proto")
set(TEXTGEN_ALLOWED_DEPS_runtime "base;kernels;proto;tokenizer;grammar;tracing")
set(TEXTGEN_ALLOWED_DEPS_router "base;proto;tokenizer;grammar;tracing")
set(TEXTGEN_ALLOWED_DEPS_operator "base")
set(TEXTGEN_ALLOWED_DEPS_launcher "base")

# Warnings for textgen's own code (generated code is built without them).
function(textgen_warnings target)
  set(cxx_flags -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align -Woverloaded-virtual
      -Wimplicit-fallthrough)
  set(cuda_flags -Xcompiler=-Wall,-Wextra)
  if(TEXTGEN_WERROR)
    list(APPEND cxx_flags -Werror)
    list(APPEND cuda_flags --Werror=all-warnings -Xcompiler=-Werror)
  endif()
  target_compile_options(${target} PRIVATE
    "$<$<COMPILE_LANGUAGE:CXX>:${cxx_flags}>"
    "$<$<COMPILE_LANGUAGE:CUDA>:${cuda_flags}>")
endfunction()

# textgen_module(<name> [GENERATED] [SOURCES src...] [DEPS module...] [LIBS external...])
# A module with no sources yet is an INTERFACE target: its headers and edges still count.
# GENERATED: sources are generated code, built without textgen's warning flags.
function(textgen_module name)
  cmake_parse_arguments(M "GENERATED" "" "SOURCES;DEPS;LIBS" ${ARGN})
  set(target textgen_${name})
  if(M_SOURCES)
    add_library(${target} STATIC ${M_SOURCES})
    set(scope PUBLIC)
    if(NOT M_GENERATED)
      textgen_warnings(${target})
    endif()
  else()
    add_library(${target} INTERFACE)
    set(scope INTERFACE)
  endif()
  add_library(textgen::${name} ALIAS ${target})
  if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/include)
    target_include_directories(${target} ${scope} ${CMAKE_CURRENT_SOURCE_DIR}/include)
  endif()
  foreach(dep IN LISTS M_DEPS)
    target_link_libraries(${target} ${scope} textgen_${dep})
  endforeach()
  if(M_LIBS)
    target_link_libraries(${target} ${scope} ${M_LIBS})
  endif()
  set_target_properties(${target} PROPERTIES TEXTGEN_MODULE ${name})
  set_property(GLOBAL APPEND PROPERTY TEXTGEN_LAYERED_TARGETS ${target})
endfunction()

# textgen_executable(<name> MODULE <module> SOURCES src... [DEPS module...] [LIBS external...])
function(textgen_executable name)
  cmake_parse_arguments(E "" "MODULE" "SOURCES;DEPS;LIBS" ${ARGN})
  add_executable(${name} ${E_SOURCES})
  textgen_warnings(${name})
  target_link_libraries(${name} PRIVATE textgen_${E_MODULE})
  foreach(dep IN LISTS E_DEPS)
    target_link_libraries(${name} PRIVATE textgen_${dep})
  endforeach()
  if(E_LIBS)
    target_link_libraries(${name} PRIVATE ${E_LIBS})
  endif()
  set_target_properties(${name} PROPERTIES TEXTGEN_MODULE ${E_MODULE})
  set_property(GLOBAL APPEND PROPERTY TEXTGEN_LAYERED_TARGETS ${name})
endfunction()

# Fails the configure step if any layered target links a module its own module may not depend on.
function(textgen_check_layering)
  get_property(targets GLOBAL PROPERTY TEXTGEN_LAYERED_TARGETS)
  foreach(target IN LISTS targets)
    get_target_property(module ${target} TEXTGEN_MODULE)
    set(allowed ${TEXTGEN_ALLOWED_DEPS_${module}} ${module})
    get_target_property(type ${target} TYPE)
    set(links "")
    if(NOT type STREQUAL "INTERFACE_LIBRARY")
      get_target_property(direct ${target} LINK_LIBRARIES)
      if(direct)
        list(APPEND links ${direct})
      endif()
    endif()
    get_target_property(iface ${target} INTERFACE_LINK_LIBRARIES)
    if(iface)
      list(APPEND links ${iface})
    endif()
    foreach(link IN LISTS links)
      if(link MATCHES "^(textgen_|textgen::)([a-z_]+)$")
        set(dep ${CMAKE_MATCH_2})
        if(NOT dep IN_LIST allowed)
          message(FATAL_ERROR "layering: ${target} (module '${module}') links textgen_${dep}; "
                              "'${module}' may depend only on: ${TEXTGEN_ALLOWED_DEPS_${module}}")
        endif()
      endif()
    endforeach()
  endforeach()
endfunction()

# The GPU code every CUDA target is built for (docs/kernels.md, "GPUs and code paths").
#
#   KVSTREAM_CUDA_GENCODE       nvcc -gencode flags of every CUDA target (default: SASS for sm_80
#                               (A100), sm_89 (L40S, Ada) and sm_90a (H100/H200), PTX for
#                               compute_80 and compute_90 that the driver compiles for GPUs
#                               newer than the SASS; sm_89 comes from the compute_80 pass)
#   KVSTREAM_CUDA_GENCODE_H200  the flags of the targets that set the property
#                               KVSTREAM_CUDA_ARCHES to "h200" (measurement-only programs run
#                               on the H200 alone; default sm_90a SASS only)
#
# kvstream_cuda_arches() (called once, after every part has made its targets) gives each target
# with CUDA sources its flags, so that no CUDA target is built for nvcc's default instead.
set(_kvstream_gencode_default
    "-gencode=arch=compute_80,code=[sm_80,sm_89,compute_80] -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_90,code=compute_90")
# The old default (sm_90a alone) left in a build tree's cache gives way to the new one.
if(KVSTREAM_CUDA_GENCODE STREQUAL "-gencode=arch=compute_90a,code=sm_90a")
  unset(KVSTREAM_CUDA_GENCODE CACHE)
endif()
set(KVSTREAM_CUDA_GENCODE "${_kvstream_gencode_default}" CACHE STRING
    "nvcc -gencode flags of every CUDA target (see cmake/CudaArches.cmake)")
set(KVSTREAM_CUDA_GENCODE_H200 "-gencode=arch=compute_90a,code=sm_90a" CACHE STRING
    "nvcc -gencode flags of the targets marked KVSTREAM_CUDA_ARCHES=h200 (H200-only programs)")

function(kvstream_cuda_arches)
  _kvstream_collect_targets(${PROJECT_SOURCE_DIR} targets)
  separate_arguments(all_flags UNIX_COMMAND "${KVSTREAM_CUDA_GENCODE}")
  separate_arguments(h200_flags UNIX_COMMAND "${KVSTREAM_CUDA_GENCODE_H200}")
  foreach(t IN LISTS targets)
    get_target_property(type ${t} TYPE)
    if(NOT type MATCHES "^(STATIC_LIBRARY|SHARED_LIBRARY|OBJECT_LIBRARY|EXECUTABLE)$")
      continue()
    endif()
    get_target_property(sources ${t} SOURCES)
    list(FILTER sources INCLUDE REGEX "\\.cu$")
    if(NOT sources)
      continue()
    endif()
    get_target_property(set_name ${t} KVSTREAM_CUDA_ARCHES)
    if(set_name STREQUAL "h200")
      set(flags ${h200_flags})
    elseif(NOT set_name OR set_name STREQUAL "all")
      set(flags ${all_flags})
    else()
      message(FATAL_ERROR "${t}: KVSTREAM_CUDA_ARCHES is '${set_name}' (known: all, h200)")
    endif()
    target_compile_options(${t} PRIVATE "$<$<COMPILE_LANGUAGE:CUDA>:${flags}>")
  endforeach()
endfunction()

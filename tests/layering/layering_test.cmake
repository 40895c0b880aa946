# cmake -DBUILD_DIR=<build> -P layering_test.cmake
# Builds the two layering objects: the allowed include must compile, the include across the
# layers must fail, and fail because the header is not on the include path.
function(build target out_rc out_log)
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${target}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE log ERROR_VARIABLE log)
  set(${out_rc} ${rc} PARENT_SCOPE)
  set(${out_log} "${log}" PARENT_SCOPE)
endfunction()

build(layering_model_own_headers rc log)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "an allowed include failed to build:\n${log}")
endif()
build(layering_model_includes_transport rc log)
if(rc EQUAL 0)
  message(FATAL_ERROR "model/ included transport/transport.h and it compiled: layers not enforced")
endif()
if(NOT log MATCHES "transport/transport.h: No such file")
  message(FATAL_ERROR "the include across the layers failed for another reason:\n${log}")
endif()
message(STATUS "layers enforced: model/ cannot include transport/ headers")

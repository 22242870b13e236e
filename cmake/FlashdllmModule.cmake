# fdl_module(NAME <name> [DEPS <targets...>]) builds every .cpp in the calling directory into
# the static library flashdllm_<name>, with include/ public. New files are picked up on the
# next build (CONFIGURE_DEPENDS), so adding a source file never needs a CMake edit.
function(fdl_module)
  cmake_parse_arguments(M "" "NAME" "DEPS" ${ARGN})
  file(GLOB _srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cpp)
  if(NOT _srcs)
    # A module with no sources yet is header-only.
    add_library(flashdllm_${M_NAME} INTERFACE)
    target_include_directories(flashdllm_${M_NAME} INTERFACE ${PROJECT_SOURCE_DIR}/include)
    target_link_libraries(flashdllm_${M_NAME} INTERFACE ${M_DEPS})
    return()
  endif()
  add_library(flashdllm_${M_NAME} STATIC ${_srcs})
  target_include_directories(flashdllm_${M_NAME} PUBLIC ${PROJECT_SOURCE_DIR}/include
                                                  PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(flashdllm_${M_NAME} PUBLIC ${M_DEPS})
endfunction()

# fdl_test(NAME <name> LABEL unit|integration DEPS <targets...>) builds tests/<dir>/*.cpp
# into one GoogleTest executable and registers every TEST with CTest under LABEL.
function(fdl_test)
  cmake_parse_arguments(T "" "NAME;LABEL" "DEPS" ${ARGN})
  file(GLOB _srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cpp)
  if(NOT _srcs)
    return()
  endif()
  add_executable(${T_NAME} ${_srcs})
  target_include_directories(${T_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(${T_NAME} PRIVATE ${T_DEPS} GTest::gtest GTest::gtest_main)
  target_compile_definitions(${T_NAME} PRIVATE
    FLASHDLLM_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    FLASHDLLM_BINARY_DIR="${CMAKE_BINARY_DIR}")
  gtest_discover_tests(${T_NAME} PROPERTIES LABELS ${T_LABEL} DISCOVERY_TIMEOUT 60)
endfunction()

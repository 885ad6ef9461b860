// File offsets of functions in an ELF executable or shared library, read once per file
// with libelf, so quanta-trace attaches dozens of driver uprobes without re-reading it.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace quanta::bpf {

// Function name -> file offset (what uprobes attach at) of every defined function in the
// dynamic and static symbol tables. Throws TraceError when `path` is not a readable ELF.
std::map<std::string, uint64_t> elf_function_offsets(const std::string& path);

}  // namespace quanta::bpf

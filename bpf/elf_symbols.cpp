// Reads an ELF file's symbol tables with libelf and converts each function's address to
// the file offset a uprobe names (address - section address + section offset).
#include "bpf/elf_symbols.h"

#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <unistd.h>

#include <cerrno>
#include <memory>

#include "bpf/trace_run.h"
#include "hosted/unique_fd.h"

namespace quanta::bpf {
namespace {

struct ElfCloser {
  void operator()(Elf* elf) const { elf_end(elf); }
};

}  // namespace

std::map<std::string, uint64_t> elf_function_offsets(const std::string& path) {
  if (elf_version(EV_CURRENT) == EV_NONE) throw TraceError("libelf is too old for this ELF");
  // Declared before the Elf handle, so the descriptor outlives it.
  const hosted::UniqueFd file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (file.get() < 0) throw TraceError("cannot open " + path + ": " + errno_text(errno));
  std::unique_ptr<Elf, ElfCloser> elf(elf_begin(file.get(), ELF_C_READ, nullptr));
  if (!elf || elf_kind(elf.get()) != ELF_K_ELF) throw TraceError(path + " is not an ELF file");
  std::map<std::string, uint64_t> offsets;
  for (Elf_Scn* scn = nullptr; (scn = elf_nextscn(elf.get(), scn)) != nullptr;) {
    GElf_Shdr header;
    if (!gelf_getshdr(scn, &header)) continue;
    if (header.sh_type != SHT_DYNSYM && header.sh_type != SHT_SYMTAB) continue;
    Elf_Data* data = elf_getdata(scn, nullptr);
    if (!data || header.sh_entsize == 0) continue;
    const size_t count = header.sh_size / header.sh_entsize;
    for (size_t i = 0; i < count; ++i) {
      GElf_Sym sym;
      if (!gelf_getsym(data, static_cast<int>(i), &sym)) continue;
      if (GELF_ST_TYPE(sym.st_info) != STT_FUNC || sym.st_value == 0) continue;
      if (sym.st_shndx == SHN_UNDEF || sym.st_shndx >= SHN_LORESERVE) continue;
      const char* name = elf_strptr(elf.get(), header.sh_link, sym.st_name);
      if (!name || !*name) continue;
      GElf_Shdr home;
      if (!gelf_getshdr(elf_getscn(elf.get(), sym.st_shndx), &home)) continue;
      offsets.emplace(name, sym.st_value - home.sh_addr + home.sh_offset);
    }
  }
  return offsets;
}

}  // namespace quanta::bpf

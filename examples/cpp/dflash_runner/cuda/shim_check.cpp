#include "shim_check.h"

#include <dlfcn.h>
#include <elf.h>

#include <algorithm>
#include <cstring>

namespace dflash {

namespace {

template <typename T>
bool read_at(const uint8_t* data, size_t size, uint64_t offset, T& out) {
  if (offset > size || size - offset < sizeof(T)) return false;
  std::memcpy(&out, data + offset, sizeof(T));
  return true;
}

}  // namespace

std::vector<std::string> undefined_symbols(const uint8_t* data, size_t size, const std::string& prefix,
                                           std::string& error) {
  std::vector<std::string> found;
  Elf64_Ehdr header;
  if (!read_at(data, size, 0, header) || std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0 ||
      header.e_ident[EI_CLASS] != ELFCLASS64 || header.e_shentsize != sizeof(Elf64_Shdr)) {
    error = "not an ELF64 shared library";
    return {};
  }
  auto section = [&](uint64_t index, Elf64_Shdr& out) {
    return index < header.e_shnum && read_at(data, size, header.e_shoff + index * sizeof(Elf64_Shdr), out);
  };
  for (uint64_t i = 0; i < header.e_shnum; ++i) {
    Elf64_Shdr symbols, names;
    if (!section(i, symbols)) {
      error = "a section header lies outside the file";
      return {};
    }
    if (symbols.sh_type != SHT_DYNSYM) continue;
    if (!section(symbols.sh_link, names) || names.sh_offset > size || size - names.sh_offset < names.sh_size ||
        symbols.sh_entsize != sizeof(Elf64_Sym)) {
      error = "its dynamic symbol table is malformed";
      return {};
    }
    for (uint64_t at = 0; at + sizeof(Elf64_Sym) <= symbols.sh_size; at += sizeof(Elf64_Sym)) {
      Elf64_Sym symbol;
      if (!read_at(data, size, symbols.sh_offset + at, symbol) || symbol.st_name >= names.sh_size) {
        error = "its dynamic symbol table is malformed";
        return {};
      }
      if (symbol.st_shndx != SHN_UNDEF || symbol.st_name == 0) continue;
      const char* name = reinterpret_cast<const char*>(data + names.sh_offset + symbol.st_name);
      const size_t room = names.sh_size - symbol.st_name;
      const size_t length = strnlen(name, room);
      if (length == room) {
        error = "a symbol name runs past its string table";
        return {};
      }
      std::string text(name, length);
      if (text.compare(0, prefix.size(), prefix) == 0) found.push_back(text);
    }
  }
  std::sort(found.begin(), found.end());
  found.erase(std::unique(found.begin(), found.end()), found.end());
  return found;
}

std::vector<std::string> not_in_executable(const std::vector<std::string>& names) {
  Dl_info self{};
  dladdr(reinterpret_cast<void*>(&not_in_executable), &self);  // this function is in the executable
  std::vector<std::string> missing;
  for (const std::string& name : names) {
    void* address = dlsym(RTLD_DEFAULT, name.c_str());
    Dl_info where{};
    if (address == nullptr || dladdr(address, &where) == 0 || where.dli_fbase != self.dli_fbase) {
      missing.push_back(name);
    }
  }
  return missing;
}

}  // namespace dflash

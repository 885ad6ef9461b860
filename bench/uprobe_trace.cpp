// ELF note parsing for USDT probes and the tracefs uprobe session.
#include "uprobe_trace.h"

#include <elf.h>
#include <fcntl.h>
#include <cerrno>
#include <cstdio>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace quanta::bench {

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

template <typename T>
T at(const std::string& data, size_t offset) {
  if (offset + sizeof(T) > data.size()) throw std::runtime_error("truncated ELF file");
  T value;
  std::memcpy(&value, data.data() + offset, sizeof(T));
  return value;
}

// tracefs control files want one write(2) per command, unbuffered and unseeked.
void write_file(const std::string& path, const std::string& text, bool append) {
  int fd = open(path.c_str(), O_WRONLY | (append ? O_APPEND : O_TRUNC));
  if (fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  std::string line = text + "\n";
  ssize_t wrote = write(fd, line.data(), line.size());
  int saved = errno;
  close(fd);
  if (wrote != static_cast<ssize_t>(line.size())) {
    throw std::runtime_error("cannot write '" + text + "' to " + path + ": " + std::strerror(saved));
  }
}

void write_quietly(const std::string& path, const std::string& text, bool append) {
  try {
    write_file(path, text, append);
  } catch (const std::exception&) {
  }
}

}  // namespace

std::vector<UsdtProbe> read_usdt_probes(const std::string& path) {
  std::string data = slurp(path);
  auto header = at<Elf64_Ehdr>(data, 0);
  if (std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0 || header.e_ident[EI_CLASS] != ELFCLASS64) {
    throw std::runtime_error(path + " is not a 64-bit ELF file");
  }
  std::vector<Elf64_Shdr> sections;
  for (int i = 0; i < header.e_shnum; ++i) sections.push_back(at<Elf64_Shdr>(data, header.e_shoff + i * header.e_shentsize));
  if (header.e_shstrndx >= sections.size()) throw std::runtime_error(path + " has no section names");
  const Elf64_Shdr& names = sections[header.e_shstrndx];
  auto section_name = [&](const Elf64_Shdr& section) { return std::string(data.c_str() + names.sh_offset + section.sh_name); };
  const Elf64_Shdr* notes = nullptr;
  const Elf64_Shdr* base = nullptr;
  for (const auto& section : sections) {
    if (section_name(section) == ".note.stapsdt") notes = &section;
    if (section_name(section) == ".stapsdt.base") base = &section;
  }
  if (notes == nullptr) throw std::runtime_error(path + " has no USDT probes (.note.stapsdt)");

  std::vector<UsdtProbe> probes;
  size_t offset = notes->sh_offset;
  size_t end = notes->sh_offset + notes->sh_size;
  auto align4 = [](size_t n) { return (n + 3) & ~size_t{3}; };
  while (offset + sizeof(Elf64_Nhdr) <= end) {
    auto note = at<Elf64_Nhdr>(data, offset);
    size_t name_at = offset + sizeof(Elf64_Nhdr);
    size_t desc_at = name_at + align4(note.n_namesz);
    if (note.n_type == 3 && std::string(data.c_str() + name_at) == "stapsdt" && note.n_descsz >= 24) {
      UsdtProbe probe;
      uint64_t pc = at<uint64_t>(data, desc_at);
      uint64_t base_address = at<uint64_t>(data, desc_at + 8);
      // A prelinked or otherwise moved file: the probe moved with .stapsdt.base.
      if (base != nullptr && base_address != 0) pc += base->sh_addr - base_address;
      const char* strings = data.c_str() + desc_at + 24;
      probe.provider = strings;
      probe.name = strings + probe.provider.size() + 1;
      probe.address = pc;
      for (int i = 0; i < header.e_phnum; ++i) {
        auto segment = at<Elf64_Phdr>(data, header.e_phoff + i * header.e_phentsize);
        if (segment.p_type == PT_LOAD && pc >= segment.p_vaddr && pc < segment.p_vaddr + segment.p_filesz) {
          probe.file_offset = pc - segment.p_vaddr + segment.p_offset;
        }
      }
      probes.push_back(probe);
    }
    offset = desc_at + align4(note.n_descsz);
  }
  return probes;
}

UprobeSession::UprobeSession(const std::string& binary, const std::string& provider, const std::vector<std::string>& probes) {
  for (const char* candidate : {"/sys/kernel/tracing", "/sys/kernel/debug/tracing"}) {
    if (std::filesystem::exists(std::string(candidate) + "/uprobe_events")) {
      tracefs_ = candidate;
      break;
    }
  }
  if (tracefs_.empty()) throw std::runtime_error("tracefs with uprobe_events is not mounted (mount -t tracefs tracefs /sys/kernel/tracing)");
  std::string absolute = std::filesystem::canonical(binary).string();
  auto found = read_usdt_probes(absolute);
  group_ = "qbench" + std::to_string(getpid());
  instance_ = tracefs_ + "/instances/" + group_;
  try {
    for (const auto& name : probes) {
      auto probe = std::find_if(found.begin(), found.end(), [&](const UsdtProbe& p) { return p.provider == provider && p.name == name; });
      if (probe == found.end()) throw std::runtime_error(absolute + " has no USDT probe " + provider + ":" + name);
      char offset[32];
      std::snprintf(offset, sizeof offset, "0x%llx", static_cast<unsigned long long>(probe->file_offset));
      write_file(tracefs_ + "/uprobe_events", "p:" + group_ + "/" + name + " " + absolute + ":" + offset, true);
      events_.push_back(name);
    }
    if (mkdir(instance_.c_str(), 0755) != 0 && errno != EEXIST) throw std::runtime_error("cannot create ftrace instance " + instance_);
    write_file(instance_ + "/trace_clock", "mono", false);
    write_file(instance_ + "/buffer_size_kb", "8192", false);
    write_file(instance_ + "/options/raw", "1", false);
    write_file(instance_ + "/events/" + group_ + "/enable", "1", false);
    attached_ = true;
  } catch (...) {
    teardown();
    throw;
  }
}

UprobeSession::~UprobeSession() { teardown(); }

void UprobeSession::teardown() {
  if (!instance_.empty() && std::filesystem::exists(instance_)) {
    write_quietly(instance_ + "/events/" + group_ + "/enable", "0", false);
    rmdir(instance_.c_str());
  }
  for (const auto& name : events_) write_quietly(tracefs_ + "/uprobe_events", "-:" + group_ + "/" + name, true);
  events_.clear();
  attached_ = false;
}

std::vector<ProbeHit> UprobeSession::collect() {
  std::vector<ProbeHit> hits;
  if (!attached_) return hits;
  write_quietly(instance_ + "/events/" + group_ + "/enable", "0", false);
  // Event ids, from each event's format file, name the probe in raw output.
  std::map<int, std::string> names;
  for (const auto& name : events_) {
    std::ifstream format(tracefs_ + "/events/" + group_ + "/" + name + "/id");
    int id = -1;
    if (format >> id) names[id] = name;
  }
  std::ifstream trace(instance_ + "/trace");
  std::string line;
  // Raw lines: "<tid> <cpu> <ts_ns> type: <id>"; the header says how many were overwritten.
  while (std::getline(trace, line)) {
    if (line.rfind("# entries-in-buffer/entries-written:", 0) == 0) {
      unsigned long long in_buffer = 0, written = 0;
      if (std::sscanf(line.c_str(), "# entries-in-buffer/entries-written: %llu/%llu", &in_buffer, &written) == 2 && written > in_buffer) {
        lost_ = written - in_buffer;
      }
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    ProbeHit hit;
    int cpu = 0, id = -1;
    std::string type;
    if (!(fields >> hit.tid >> cpu >> hit.ts_ns >> type >> id) || type != "type:") continue;
    auto name = names.find(id);
    if (name == names.end()) continue;
    hit.probe = name->second;
    hits.push_back(hit);
  }
  std::sort(hits.begin(), hits.end(), [](const ProbeHit& a, const ProbeHit& b) { return a.ts_ns < b.ts_ns; });
  teardown();
  return hits;
}

std::vector<double> handoffs_from_hits(const std::vector<ProbeHit>& hits, const std::map<uint32_t, int>& tenant_of_tid,
                                       const std::vector<int>& tenant_devices) {
  struct Release {
    int tenant = -1;
    uint64_t ts_ns = 0;
  };
  std::map<int, Release> released;            // device -> last release not yet handed on
  std::map<int, uint64_t> waiting_since;      // tenant -> gate_wait_begin of its current wait
  std::vector<double> out;
  for (const auto& hit : hits) {
    auto tenant = tenant_of_tid.find(hit.tid);
    if (tenant == tenant_of_tid.end() || tenant->second < 0 || static_cast<size_t>(tenant->second) >= tenant_devices.size()) continue;
    int who = tenant->second;
    int device = tenant_devices[who];
    if (hit.probe == "release") {
      released[device] = Release{who, hit.ts_ns};
    } else if (hit.probe == "gate_wait_begin") {
      waiting_since.emplace(who, hit.ts_ns);
    } else if (hit.probe == "gate_wait_end") {
      auto began = waiting_since.find(who);
      auto pending = released.find(device);
      // A handoff: another tenant, already waiting when the GPU was released, passes
      // its gate. A tenant that started waiting later measures its own lateness, not
      // the handoff, and is left out.
      if (pending != released.end() && pending->second.tenant != who && began != waiting_since.end() &&
          began->second <= pending->second.ts_ns) {
        out.push_back(static_cast<double>(hit.ts_ns - pending->second.ts_ns) / 1e3);
        released.erase(pending);
      }
      if (began != waiting_since.end()) waiting_since.erase(began);
    }
  }
  return out;
}

}  // namespace quanta::bench

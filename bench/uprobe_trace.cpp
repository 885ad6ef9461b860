// ELF note parsing for USDT probes and the tracefs uprobe session.
#include "bench/uprobe_trace.h"

#include <elf.h>
#include <fcntl.h>
#include <cerrno>
#include <cstdio>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
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
      std::istringstream locations(strings + probe.provider.size() + 1 + probe.name.size() + 1);
      for (std::string location; locations >> location;) probe.arguments.push_back(location);
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

std::string tracefs_fetch(const std::string& location) {
  const size_t at_sign = location.find('@');
  const std::string size = location.substr(0, at_sign == std::string::npos ? 0 : at_sign);
  static const std::map<std::string, std::string> kTypes = {{"1", "u8"},  {"-1", "s8"},  {"2", "u16"}, {"-2", "s16"},
                                                            {"4", "u32"}, {"-4", "s32"}, {"8", "u64"}, {"-8", "s64"}};
  auto type = kTypes.find(size);
  if (at_sign == std::string::npos || type == kTypes.end()) {
    throw std::runtime_error("USDT argument '" + location + "' has no size of 1, 2, 4 or 8 bytes before '@'");
  }
  std::string where = location.substr(at_sign + 1);
  // tracefs names a register by its 64-bit name without the 'r' (ax, r10): the 32-, 16-
  // and 8-bit names of the same register map to it, and the type keeps the width.
  auto register_name = [&](std::string name) {
    static const std::map<std::string, std::string> kLegacy = {
        {"rax", "ax"}, {"eax", "ax"}, {"ax", "ax"}, {"al", "ax"}, {"rbx", "bx"}, {"ebx", "bx"}, {"bx", "bx"}, {"bl", "bx"},
        {"rcx", "cx"}, {"ecx", "cx"}, {"cx", "cx"}, {"cl", "cx"}, {"rdx", "dx"}, {"edx", "dx"}, {"dx", "dx"}, {"dl", "dx"},
        {"rsi", "si"}, {"esi", "si"}, {"si", "si"}, {"sil", "si"}, {"rdi", "di"}, {"edi", "di"}, {"di", "di"}, {"dil", "di"},
        {"rbp", "bp"}, {"ebp", "bp"}, {"bp", "bp"}, {"bpl", "bp"}, {"rsp", "sp"}, {"esp", "sp"}, {"sp", "sp"}, {"spl", "sp"},
        {"rip", "ip"}};
    auto legacy = kLegacy.find(name);
    if (legacy != kLegacy.end()) return legacy->second;
    // r8 .. r15 with an optional d, w or b suffix.
    size_t digits = 1;
    while (digits < name.size() && std::isdigit(static_cast<unsigned char>(name[digits]))) ++digits;
    const std::string number = name.substr(1, digits - 1);
    const std::string suffix = name.substr(digits);
    if (name.size() > 1 && name[0] == 'r' && !number.empty() && number.size() <= 2 && std::stoi(number) >= 8 &&
        std::stoi(number) <= 15 &&
        (suffix.empty() || suffix == "d" || suffix == "w" || suffix == "b")) {
      return "r" + number;
    }
    throw std::runtime_error("USDT argument '" + location + "' names register %" + name + ", which is not one of x86-64's");
  };
  if (where.size() > 1 && where[0] == '%') return "%" + register_name(where.substr(1)) + ":" + type->second;
  const size_t open = where.find("(%");
  if (open != std::string::npos && where.back() == ')' && where.find(',') == std::string::npos) {
    const std::string offset = where.substr(0, open);
    const bool numeric = !offset.empty() && offset.find_first_not_of("-0123456789") == std::string::npos &&
                         offset.find('-', 1) == std::string::npos;
    if (offset.empty() || numeric) {
      const std::string base = register_name(where.substr(open + 2, where.size() - open - 3));
      const std::string signed_offset = offset.empty() ? "+0" : (offset[0] == '-' ? offset : "+" + offset);
      return signed_offset + "(%" + base + "):" + type->second;
    }
  }
  throw std::runtime_error("USDT argument '" + location +
                           "' is neither a register nor a register plus an offset, which is what tracefs can fetch");
}

bool parse_trace_line(const std::string& line, std::string& event, ProbeHit& hit) {
  // "<comm>-<tid> [<cpu>] <flags> <seconds>.<microseconds>: <event>: (<address>) a1=<value> ..."
  const size_t cpu = line.find(" [");
  if (line.empty() || line[0] == '#' || cpu == std::string::npos) return false;
  size_t task_end = line.find_last_not_of(' ', cpu);
  if (task_end == std::string::npos) return false;
  const size_t dash = line.rfind('-', task_end);
  if (dash == std::string::npos) return false;
  std::istringstream rest(line.substr(dash + 1));
  std::string cpu_field, stamp, name, address;
  unsigned long tid = 0;
  if (!(rest >> tid >> cpu_field >> stamp)) return false;
  // Flags ("d....") stand before the time unless an older kernel left them out.
  if (stamp.empty() || stamp.back() != ':') {
    if (!(rest >> stamp)) return false;
  }
  if (!(rest >> name >> address) || address.empty() || address[0] != '(') return false;
  if (stamp.size() < 2 || stamp.back() != ':' || name.size() < 2 || name.back() != ':') return false;
  stamp.pop_back();
  const size_t point = stamp.find('.');
  if (point == std::string::npos || stamp.size() - point - 1 != 6) return false;
  try {
    hit.ts_ns = std::stoull(stamp.substr(0, point)) * 1'000'000'000ull + std::stoull(stamp.substr(point + 1)) * 1000ull;
  } catch (const std::exception&) {
    return false;
  }
  hit.tid = static_cast<uint32_t>(tid);
  event = name.substr(0, name.size() - 1);
  hit.arguments.clear();
  for (std::string field; rest >> field;) {
    const size_t equals = field.find('=');
    if (field.size() < 3 || field[0] != 'a' || equals == std::string::npos) return false;
    try {
      size_t used = 0;
      hit.arguments.push_back(std::stoull(field.substr(equals + 1), &used, 0));
      if (used != field.size() - equals - 1) return false;
    } catch (const std::exception&) {
      return false;
    }
  }
  return true;
}

UprobeSession::UprobeSession(const std::string& binary, const std::string& provider, const std::vector<ProbeRequest>& probes) {
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
    for (const auto& request : probes) {
      auto probe = std::find_if(found.begin(), found.end(), [&](const UsdtProbe& p) { return p.provider == provider && p.name == request.name; });
      if (probe == found.end()) throw std::runtime_error(absolute + " has no USDT probe " + provider + ":" + request.name);
      char offset[32];
      std::snprintf(offset, sizeof offset, "0x%llx", static_cast<unsigned long long>(probe->file_offset));
      std::string command = "p:" + group_ + "/" + request.name + " " + absolute + ":" + offset;
      for (size_t i = 0; i < request.arguments.size(); ++i) {
        const int index = request.arguments[i];
        if (index < 1 || static_cast<size_t>(index) > probe->arguments.size()) {
          throw std::runtime_error(provider + ":" + request.name + " has " + std::to_string(probe->arguments.size()) +
                                   " arguments, not an argument " + std::to_string(index));
        }
        command += " a" + std::to_string(i + 1) + "=" + tracefs_fetch(probe->arguments[index - 1]);
      }
      write_file(tracefs_ + "/uprobe_events", command, true);
      events_[request.name] = request.arguments.size();
    }
    if (mkdir(instance_.c_str(), 0755) != 0 && errno != EEXIST) throw std::runtime_error("cannot create ftrace instance " + instance_);
    write_file(instance_ + "/trace_clock", "mono", false);
    write_file(instance_ + "/buffer_size_kb", "8192", false);
    // Text output: raw output has nanoseconds but leaves out fetched arguments, and the
    // text's microseconds are enough where the shim's own stamps time the hits.
    write_file(instance_ + "/options/raw", "0", false);
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
  for (const auto& [name, arguments] : events_) write_quietly(tracefs_ + "/uprobe_events", "-:" + group_ + "/" + name, true);
  events_.clear();
  attached_ = false;
}

std::vector<ProbeHit> UprobeSession::collect() {
  std::vector<ProbeHit> hits;
  if (!attached_) return hits;
  write_quietly(instance_ + "/events/" + group_ + "/enable", "0", false);
  std::ifstream trace(instance_ + "/trace");
  std::string line;
  while (std::getline(trace, line)) {
    // The header says how many events were overwritten.
    if (line.rfind("# entries-in-buffer/entries-written:", 0) == 0) {
      unsigned long long in_buffer = 0, written = 0;
      if (std::sscanf(line.c_str(), "# entries-in-buffer/entries-written: %llu/%llu", &in_buffer, &written) == 2 && written > in_buffer) {
        lost_ = written - in_buffer;
      }
      continue;
    }
    ProbeHit hit;
    std::string event;
    if (!parse_trace_line(line, event, hit)) continue;
    auto attached = events_.find(event);
    if (attached == events_.end() || hit.arguments.size() != attached->second) continue;
    hit.probe = event;
    hits.push_back(std::move(hit));
  }
  std::stable_sort(hits.begin(), hits.end(), [](const ProbeHit& a, const ProbeHit& b) { return a.ts_ns < b.ts_ns; });
  teardown();
  return hits;
}

std::vector<Handoff> handoffs_from_hits(const std::vector<ProbeHit>& hits, const std::map<uint32_t, int>& tenant_of_tid,
                                       const std::vector<int>& tenant_devices) {
  struct Moment {
    const ProbeHit* hit;
    uint64_t at_ns;  // the shim's stamp
  };
  std::vector<Moment> moments;
  for (const auto& hit : hits) {
    if (hit.probe == "release" && hit.arguments.size() == 1) moments.push_back({&hit, hit.arguments[0]});
    if (hit.probe == "gate_wait_end" && hit.arguments.size() == 2) moments.push_back({&hit, hit.arguments[1]});
  }
  std::stable_sort(moments.begin(), moments.end(), [](const Moment& a, const Moment& b) { return a.at_ns < b.at_ns; });

  struct Release {
    int tenant = -1;
    uint64_t at_ns = 0;
  };
  std::map<int, Release> released;  // device -> last release not yet handed on
  std::set<int> passed;              // tenants seen passing their gate after a wait
  std::vector<Handoff> out;
  for (const auto& moment : moments) {
    const ProbeHit& hit = *moment.hit;
    auto tenant = tenant_of_tid.find(hit.tid);
    if (tenant == tenant_of_tid.end() || tenant->second < 0 || static_cast<size_t>(tenant->second) >= tenant_devices.size()) continue;
    int who = tenant->second;
    int device = tenant_devices[who];
    if (hit.probe == "release") {
      released[device] = Release{who, moment.at_ns};
      continue;
    }
    const uint64_t waited = hit.arguments[0];
    const uint64_t began = moment.at_ns > waited ? moment.at_ns - waited : 0;
    const bool first_pass = passed.insert(who).second;
    auto pending = released.find(device);
    // A handoff: another tenant, already waiting when the GPU was released, passes its
    // gate. A tenant that started waiting later measures its own lateness, not the
    // handoff, and is left out.
    if (pending != released.end() && pending->second.tenant != who && began <= pending->second.at_ns) {
      out.push_back({pending->second.at_ns, static_cast<double>(moment.at_ns - pending->second.at_ns) / 1e3, first_pass});
      released.erase(pending);
    }
  }
  return out;
}

}  // namespace quanta::bench

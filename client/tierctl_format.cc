#include "client/tierctl_format.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/byte_size.h"
#include "google/protobuf/descriptor.h"

namespace tierd {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// One value of `field`: element `index` of a repeated field, or the singular value when index < 0.
Json FieldValueToJson(const Message& message, const FieldDescriptor& field, int index) {
  const Reflection& r = *message.GetReflection();
  const bool rep = index >= 0;
  switch (field.cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return rep ? r.GetRepeatedInt32(message, &field, index) : r.GetInt32(message, &field);
    case FieldDescriptor::CPPTYPE_INT64:
      return rep ? r.GetRepeatedInt64(message, &field, index) : r.GetInt64(message, &field);
    case FieldDescriptor::CPPTYPE_UINT32:
      return rep ? r.GetRepeatedUInt32(message, &field, index) : r.GetUInt32(message, &field);
    case FieldDescriptor::CPPTYPE_UINT64:
      return rep ? r.GetRepeatedUInt64(message, &field, index) : r.GetUInt64(message, &field);
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return rep ? r.GetRepeatedDouble(message, &field, index) : r.GetDouble(message, &field);
    case FieldDescriptor::CPPTYPE_FLOAT:
      return rep ? r.GetRepeatedFloat(message, &field, index) : r.GetFloat(message, &field);
    case FieldDescriptor::CPPTYPE_BOOL:
      return rep ? r.GetRepeatedBool(message, &field, index) : r.GetBool(message, &field);
    case FieldDescriptor::CPPTYPE_ENUM:
      return (rep ? r.GetRepeatedEnum(message, &field, index) : r.GetEnum(message, &field))->name();
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string value =
          rep ? r.GetRepeatedString(message, &field, index) : r.GetString(message, &field);
      if (field.type() == FieldDescriptor::TYPE_BYTES) return absl::Base64Escape(value);
      return value;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return ProtoToJson(rep ? r.GetRepeatedMessage(message, &field, index)
                             : r.GetMessage(message, &field));
  }
  return Json();
}

// Columns a string takes on a terminal: its UTF-8 code points (labels hold arrows).
size_t DisplayWidth(const std::string& text) {
  return std::count_if(text.begin(), text.end(),
                       [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}

std::string Percent(uint64_t part, uint64_t whole) {
  return absl::StrFormat("%.1f%%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
}

// "12.0 GiB of 60.0 GiB (20.0%)".
std::string UsedOfBudget(uint64_t used, uint64_t budget) {
  std::string text = absl::StrCat(FormatByteSize(used), " of ", FormatByteSize(budget));
  if (budget > 0) absl::StrAppend(&text, " (", Percent(used, budget), ")");
  return text;
}

// "97 (97.0% of lookups)".
std::string Hits(uint64_t hits, uint64_t misses) {
  std::string text = absl::StrCat(hits);
  if (hits + misses > 0) absl::StrAppend(&text, " (", Percent(hits, hits + misses), " of lookups)");
  return text;
}

struct Section {
  std::string title;
  std::vector<std::pair<std::string, std::string>> lines;
};

// Titles flush left, their lines indented, every value starting in the same column.
std::string FormatSections(const std::vector<Section>& sections) {
  size_t label_width = 0;
  for (const Section& section : sections) {
    for (const auto& [label, value] : section.lines) {
      label_width = std::max(label_width, DisplayWidth(label));
    }
  }
  std::string text;
  for (const Section& section : sections) {
    absl::StrAppend(&text, section.title, "\n");
    for (const auto& [label, value] : section.lines) {
      absl::StrAppend(&text, "  ", label, std::string(label_width - DisplayWidth(label) + 2, ' '),
                      value, "\n");
    }
  }
  return text;
}

const v1::FigureOptions& FigureOf(const FieldDescriptor& field) {
  return field.options().GetExtension(v1::figure);
}

// A figure's value as `tierctl stats` shows it: by its unit, and with what puts it in context
// where there is some (used of budget, hits as a share of lookups).
std::string FigureText(const Message& message, const FieldDescriptor& field) {
  const uint64_t value = message.GetReflection()->GetUInt64(message, &field);
  if (field.containing_type() == v1::TierStats::descriptor()) {
    const auto& tier = static_cast<const v1::TierStats&>(message);
    if (field.number() == v1::TierStats::kUsedBytesFieldNumber) {
      return UsedOfBudget(value, tier.budget_bytes());
    }
    if (field.number() == v1::TierStats::kHitsFieldNumber) return Hits(value, tier.misses());
  }
  switch (FigureOf(field).unit()) {
    case v1::FigureOptions::BYTES:
      return FormatByteSize(value);
    case v1::FigureOptions::MICROSECONDS:
      return absl::FormatDuration(absl::Microseconds(value));
    default:
      return absl::StrCat(value);
  }
}

// The lines of `message`'s figures that have a label (proto/tierd/v1/tierd.proto).
std::vector<std::pair<std::string, std::string>> FigureLines(const Message& message) {
  std::vector<std::pair<std::string, std::string>> lines;
  const google::protobuf::Descriptor& descriptor = *message.GetDescriptor();
  for (int i = 0; i < descriptor.field_count(); ++i) {
    const FieldDescriptor& field = *descriptor.field(i);
    if (field.cpp_type() != FieldDescriptor::CPPTYPE_UINT64 || FigureOf(field).label().empty()) {
      continue;
    }
    lines.emplace_back(FigureOf(field).label(), FigureText(message, field));
  }
  return lines;
}

// The section titled `title`, added at the end when there is none yet.
Section& SectionTitled(std::vector<Section>& sections, const std::string& title) {
  for (Section& section : sections) {
    if (section.title == title) return section;
  }
  sections.push_back({title, {}});
  return sections.back();
}

int TerminalColumns() {
  struct winsize size {};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return 80;
}

}  // namespace

Json ProtoToJson(const Message& message) {
  const Reflection& reflection = *message.GetReflection();
  const google::protobuf::Descriptor& descriptor = *message.GetDescriptor();
  Json json = Json::object();
  for (int i = 0; i < descriptor.field_count(); ++i) {
    const FieldDescriptor& field = *descriptor.field(i);
    if (field.is_repeated()) {
      Json values = Json::array();
      for (int j = 0; j < reflection.FieldSize(message, &field); ++j) {
        values.push_back(FieldValueToJson(message, field, j));
      }
      json[field.name()] = std::move(values);
      continue;
    }
    // Only the member of a oneof that is set means anything.
    if (field.containing_oneof() != nullptr && !reflection.HasField(message, &field)) continue;
    json[field.name()] = FieldValueToJson(message, field, -1);
  }
  return json;
}

void PrintJson(const Json& json) {
  std::string text = json.dump(2, ' ', false, Json::error_handler_t::replace);
  text += '\n';
  std::fwrite(text.data(), 1, text.size(), stdout);
}

std::string EscapeForText(absl::string_view text) {
  std::string escaped;
  escaped.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char byte = static_cast<unsigned char>(text[i]);
    if (byte < 0x80) {
      switch (byte) {
        case '\\':
          escaped += "\\\\";
          break;
        case '\b':
          escaped += "\\b";
          break;
        case '\f':
          escaped += "\\f";
          break;
        case '\n':
          escaped += "\\n";
          break;
        case '\r':
          escaped += "\\r";
          break;
        case '\t':
          escaped += "\\t";
          break;
        default:
          if (byte < 0x20 || byte == 0x7f) {
            absl::StrAppendFormat(&escaped, "\\u%04x", byte);
          } else {
            escaped += static_cast<char>(byte);
          }
      }
      ++i;
      continue;
    }
    // A UTF-8 sequence: its length from the lead byte, then continuation bytes, no overlong form,
    // no surrogate, nothing past U+10FFFF.
    const size_t length = byte >= 0xF0 ? 4 : byte >= 0xE0 ? 3 : byte >= 0xC0 ? 2 : 0;
    uint32_t code_point = length == 4 ? byte & 0x07 : length == 3 ? byte & 0x0F : byte & 0x1F;
    bool valid = length != 0 && byte < 0xF8 && i + length <= text.size();
    for (size_t k = 1; valid && k < length; ++k) {
      const unsigned char next = static_cast<unsigned char>(text[i + k]);
      valid = (next & 0xC0) == 0x80;
      code_point = (code_point << 6) | (next & 0x3F);
    }
    constexpr uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
    valid = valid && code_point >= kSmallest[length] && code_point <= 0x10FFFF &&
            !(code_point >= 0xD800 && code_point <= 0xDFFF);
    if (!valid) {
      absl::StrAppendFormat(&escaped, "\\x%02x", byte);
      ++i;
      continue;
    }
    if (code_point <= 0x9F) {
      absl::StrAppendFormat(&escaped, "\\u%04x", code_point);  // C1 controls
    } else {
      escaped.append(text.data() + i, length);
    }
    i += length;
  }
  return escaped;
}

std::string GroupingName(v1::Grouping grouping) {
  switch (grouping) {
    case v1::GROUPING_TENSOR:
      return "tensor";
    case v1::GROUPING_PHASE:
      return "phase";
    case v1::GROUPING_UNSPECIFIED:
    case v1::GROUPING_BLOCK:
      return "block";
    default:
      return absl::StrCat("grouping ", static_cast<int>(grouping));
  }
}

Table::Table(std::vector<std::string> header, std::vector<bool> right_aligned)
    : rows_{std::move(header)}, right_aligned_(std::move(right_aligned)) {
  right_aligned_.resize(rows_.front().size(), false);
}

void Table::AddRow(std::vector<std::string> cells) {
  cells.resize(rows_.front().size());
  rows_.push_back(std::move(cells));
}

std::string Table::ToString() const {
  const size_t columns = rows_.front().size();
  std::vector<size_t> widths(columns, 0);
  for (const auto& row : rows_) {
    for (size_t c = 0; c < columns; ++c) widths[c] = std::max(widths[c], DisplayWidth(row[c]));
  }
  std::string text;
  for (const auto& row : rows_) {
    for (size_t c = 0; c < columns; ++c) {
      const std::string padding(widths[c] - DisplayWidth(row[c]), ' ');
      if (c > 0) text += "  ";
      if (right_aligned_[c]) {
        absl::StrAppend(&text, padding, row[c]);
      } else if (c + 1 < columns) {
        absl::StrAppend(&text, row[c], padding);
      } else {
        text += row[c];
      }
    }
    // An empty last cell would leave the separator dangling.
    while (!text.empty() && text.back() == ' ') text.pop_back();
    text += '\n';
  }
  return text;
}

std::string FormatModels(const std::vector<v1::ModelSummary>& models) {
  const bool any_stale = std::any_of(models.begin(), models.end(),
                                     [](const v1::ModelSummary& m) { return !m.stale().empty(); });
  std::vector<std::string> header = {"NAME", "GROUPING", "FILES", "OBJECTS", "TENSORS", "SIZE"};
  // The NOTE column only when there is something to say, so the usual table stays narrow.
  if (any_stale) header.push_back("NOTE");
  Table table(std::move(header), {false, false, true, true, true, true, false});
  for (const v1::ModelSummary& model : models) {
    std::vector<std::string> row = {
        EscapeForText(model.name()),   GroupingName(model.grouping()),
        absl::StrCat(model.files()),   absl::StrCat(model.objects()),
        absl::StrCat(model.tensors()), FormatByteSize(model.total_bytes())};
    if (any_stale)
      row.push_back(model.stale().empty() ? ""
                                          : absl::StrCat("stale: ", EscapeForText(model.stale())));
    table.AddRow(std::move(row));
  }
  return table.ToString();
}

std::string FormatRetainedSets(const std::vector<v1::RetainedSet>& sets, uint64_t bytes,
                               uint64_t budget_bytes) {
  Table table({"TARGET", "OBJECTS", "SIZE", "STATE", "TTL", "IDLE", "MOVED"},
              {false, true, true, false, true, true, true});
  for (const v1::RetainedSet& set : sets) {
    table.AddRow({EscapeForText(set.target()), absl::StrCat(set.objects()),
                  FormatByteSize(set.bytes()), set.asleep() ? "asleep" : "on gpu",
                  set.ttl_ms() == 0 ? "-" : absl::FormatDuration(absl::Milliseconds(set.ttl_ms())),
                  absl::FormatDuration(absl::Seconds(set.idle_ms() / 1000)),
                  absl::StrCat(set.moved())});
  }
  std::string text = table.ToString();
  if (budget_bytes > 0) {
    absl::StrAppend(&text, sets.size(), " set(s); ", FormatByteSize(bytes), " on the GPU of a ",
                    FormatByteSize(budget_bytes), " budget");
  }
  return text;
}

std::string FormatObjects(const std::vector<v1::ObjectInfo>& objects) {
  // The HOME column only for a daemon of a node (its objects have homes).
  bool homed = false;
  for (const v1::ObjectInfo& object : objects) homed = homed || !object.home().empty();
  std::vector<std::string> header = {"KEY", "SIZE", "TENSORS", "WHERE", "IN HOST MEMORY"};
  if (homed) header.push_back("HOME");
  Table table(std::move(header), {false, true, true, false, true, false});
  uint64_t total_bytes = 0;
  size_t on_gpu = 0;
  size_t in_host = 0;
  uint64_t host_bytes = 0;      // what the objects in host memory take there
  uint64_t host_raw_bytes = 0;  // what they would take raw
  for (const v1::ObjectInfo& object : objects) {
    const char* where = object.on_gpu() ? "gpu" : object.in_host_cache() ? "host" : "disk";
    // "-" when not there; a compressed object's bytes with their share of its size.
    std::string held = "-";
    if (object.host_bytes() > 0) {
      held = FormatByteSize(object.host_bytes());
      if (object.host_bytes() < object.size()) {
        absl::StrAppend(&held, absl::StrFormat(" (%.2f)", static_cast<double>(object.host_bytes()) /
                                                              static_cast<double>(object.size())));
      }
      host_bytes += object.host_bytes();
      host_raw_bytes += object.size();
    }
    std::vector<std::string> row = {EscapeForText(object.key()), FormatByteSize(object.size()),
                                    absl::StrCat(object.tensors_size()), where, std::move(held)};
    if (homed) row.push_back(EscapeForText(object.home()));
    table.AddRow(std::move(row));
    total_bytes += object.size();
    on_gpu += object.on_gpu() ? 1 : 0;
    in_host += object.in_host_cache() ? 1 : 0;
  }
  const std::string saved = host_bytes < host_raw_bytes
                                ? absl::StrCat(", compressed to ", FormatByteSize(host_bytes),
                                               " from ", FormatByteSize(host_raw_bytes))
                                : "";
  return absl::StrCat(table.ToString(), objects.size(), " objects, ", FormatByteSize(total_bytes),
                      "; ", on_gpu, " on the GPU, ", in_host, " in this daemon's host memory",
                      saved, homed ? " (HOME: the node's daemon that keeps it in host memory)" : "",
                      "\n");
}

std::string FormatStats(const v1::Stats& stats) {
  std::vector<Section> sections;
  sections.push_back({absl::StrCat("device: ", stats.device()), {}});
  if (!stats.version().empty()) {
    sections.push_back({absl::StrCat("version: ", stats.version()), {}});
  }
  // Each figure under the section its field declares, in the order of the fields: a TierStats
  // field's figures, then the section's own.
  const google::protobuf::Descriptor& descriptor = *v1::Stats::descriptor();
  const Reflection& reflection = *stats.GetReflection();
  for (int i = 0; i < descriptor.field_count(); ++i) {
    const FieldDescriptor& field = *descriptor.field(i);
    const v1::FigureOptions& figure = FigureOf(field);
    if (figure.section().empty() || field.is_repeated()) continue;
    Section& section = SectionTitled(sections, figure.section());
    if (field.cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      for (auto& line : FigureLines(reflection.GetMessage(stats, &field))) {
        section.lines.push_back(std::move(line));
      }
    } else if (field.cpp_type() == FieldDescriptor::CPPTYPE_UINT64 && !figure.label().empty()) {
      section.lines.emplace_back(figure.label(), FigureText(stats, field));
    }
  }
  for (const v1::ClientGroupStats& group : stats.client_groups()) {
    Section section{absl::StrCat("client group ", group.name(), ": GPU tier"),
                    FigureLines(group.gpu())};
    section.lines.push_back({"sessions", absl::StrCat(group.sessions(), " (", group.leases(),
                                                      " leases, ", group.pins(), " pins)")});
    section.lines.push_back(
        {"events", absl::StrCat(group.events_in_use(), " in use of ", group.events(), " (at most ",
                                group.events_max(), ")")});
    sections.push_back(std::move(section));
  }
  return FormatSections(sections);
}

std::string FormatModelSummary(const v1::ModelSummary& summary) {
  std::string text =
      absl::StrCat("registered ", EscapeForText(summary.name()), " from ",
                   EscapeForText(summary.directory()), " (", GroupingName(summary.grouping()),
                   " grouping)\n  ", summary.files(), " files, ", summary.objects(), " objects, ",
                   summary.tensors(), " tensors, ", FormatByteSize(summary.total_bytes()), "\n");
  if (!summary.stale().empty()) {
    absl::StrAppend(&text, "  stale: ", EscapeForText(summary.stale()), "\n");
  }
  return text;
}

RegisterProgress::RegisterProgress() : terminal_(::isatty(STDERR_FILENO) == 1) {}

RegisterProgress::~RegisterProgress() {
  if (drawn_) std::fputs("\r\x1b[K", stderr);
}

void RegisterProgress::Update(const v1::RegisterModelProgress& progress) {
  if (progress.files_total() == 0 || progress.current_file().empty()) return;
  // Headers first, a file at a time; then, with --verify, every object's bytes.
  const bool verifying = progress.bytes_to_verify() > 0;
  const std::string count =
      verifying ? absl::StrCat(FormatByteSize(progress.bytes_verified()), "/",
                               FormatByteSize(progress.bytes_to_verify()), " verified")
                : absl::StrCat(progress.files_done(), "/", progress.files_total(), " files");
  if (!terminal_) {
    std::fprintf(stderr, "[%s] %s\n", count.c_str(), progress.current_file().c_str());
    return;
  }
  constexpr int kBarWidth = 24;
  const uint64_t total = verifying ? progress.bytes_to_verify() : progress.files_total();
  const uint64_t done =
      std::min<uint64_t>(verifying ? progress.bytes_verified() : progress.files_done(), total);
  const int filled = static_cast<int>(static_cast<double>(done) / total * kBarWidth);
  std::string line = absl::StrCat("[", std::string(filled, '#'),
                                  std::string(kBarWidth - filled, '.'), "] ", count, "  ");
  // Keep the line within the terminal: a wrapped line cannot be redrawn with \r.
  const size_t room = static_cast<size_t>(std::max(TerminalColumns() - 1, 0));
  std::string file = progress.current_file();
  if (line.size() + file.size() > room) {
    const size_t keep = room > line.size() + 3 ? room - line.size() - 3 : 0;
    file = keep == 0 ? "" : absl::StrCat("...", file.substr(file.size() - keep));
  }
  std::fprintf(stderr, "\r%s%s\x1b[K", line.c_str(), file.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

}  // namespace tierd

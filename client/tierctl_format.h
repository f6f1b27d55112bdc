// How tierctl shows things: aligned tables and grouped counters for people, JSON for scripts, and
// the progress of a model registration. Only tierctl uses it.
#ifndef TIERD_CLIENT_TIERCTL_FORMAT_H_
#define TIERD_CLIENT_TIERCTL_FORMAT_H_

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "nlohmann/json.hpp"
#include "tierd/v1/tierd.pb.h"

namespace tierd {

// Field order kept as in the proto, so JSON reads like the API documentation.
using Json = nlohmann::ordered_json;

// Every field of `message` under its proto name, defaults included (a script should not have to
// know proto3 omits zeros). Unlike protobuf's JSON mapping, 64-bit integers stay numbers: jq
// compares a quoted "1024" with 512 by type, not value. Enums are their names; bytes are base64.
Json ProtoToJson(const google::protobuf::Message& message);

// Writes `json` to stdout as one indented document. Invalid UTF-8 in strings (file names) is
// replaced rather than thrown on.
void PrintJson(const Json& json);

// `text` as a terminal may show it: escaped as JSON escapes a string, without the quotes. A
// backslash becomes \\, control characters (C0, DEL, C1) \n, \t, \u0000 and the like, and bytes
// that are not UTF-8 \xNN; the rest is kept. Keys and names from the daemon are shown through it:
// a NUL would end the output and an ESC would drive the terminal.
std::string EscapeForText(absl::string_view text);

// "tensor", "block" or "phase"; unspecified is block, as the daemon reads it.
std::string GroupingName(v1::Grouping grouping);

// Columns padded to their widest cell; the columns flagged in `right_aligned` (numbers) are
// right-aligned. The last column is never padded, so free text there does not widen the table.
class Table {
 public:
  Table(std::vector<std::string> header, std::vector<bool> right_aligned);
  // REQUIRES: cells.size() == the header's size.
  void AddRow(std::vector<std::string> cells);
  std::string ToString() const;

 private:
  std::vector<std::vector<std::string>> rows_;
  std::vector<bool> right_aligned_;
};

// `ls`: one row per model.
std::string FormatModels(const std::vector<v1::ModelSummary>& models);
// `ls NAME`: one row per object; WHERE is the fastest tier holding it (gpu, host, or disk).
std::string FormatObjects(const std::vector<v1::ObjectInfo>& objects);
// A table of retained sets; with a budget, a last line of what they hold of it.
std::string FormatRetainedSets(const std::vector<v1::RetainedSet>& sets, uint64_t bytes = 0,
                               uint64_t budget_bytes = 0);
// `stats`: the counters grouped by tier and stage.
std::string FormatStats(const v1::Stats& stats);
// `load`: the summary of a registered model.
std::string FormatModelSummary(const v1::ModelSummary& summary);

// Shows RegisterModel's progress on stderr: a bar redrawn in place when stderr is a terminal,
// otherwise one line per parsed file. Not thread-safe; feed it from the thread that calls
// RegisterModel.
class RegisterProgress {
 public:
  RegisterProgress();
  // Clears the bar, so whatever is printed next starts on a clean line.
  ~RegisterProgress();
  RegisterProgress(const RegisterProgress&) = delete;
  RegisterProgress& operator=(const RegisterProgress&) = delete;

  void Update(const v1::RegisterModelProgress& progress);

 private:
  const bool terminal_;
  bool drawn_ = false;
};

}  // namespace tierd

#endif  // TIERD_CLIENT_TIERCTL_FORMAT_H_

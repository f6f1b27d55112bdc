#include "remote/s3_credentials.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/posix_error.h"

namespace tierd {
namespace {

using Section = std::map<std::string, std::string>;
using IniFile = std::map<std::string, Section>;

std::function<std::optional<std::string>(const char*)> EnvironmentOf(
    const S3CredentialOptions& options) {
  if (options.getenv) return options.getenv;
  return [](const char* name) -> std::optional<std::string> {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') return std::nullopt;
    return std::string(value);
  };
}

// The AWS files' format: "[section]" lines, then "key = value" lines; '#' and ';' start comments.
// Errors name the file and the line number, never the line.
absl::StatusOr<IniFile> ReadIniFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return PosixError(absl::StrCat("reading ", path), errno);
  IniFile file;
  Section* section = nullptr;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text.empty() || text.front() == '#' || text.front() == ';') continue;
    if (text.front() == '[') {
      if (text.back() != ']') {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ":", number, ": a section header without its ']'"));
      }
      section = &file[std::string(absl::StripAsciiWhitespace(text.substr(1, text.size() - 2)))];
      continue;
    }
    const size_t equals = text.find('=');
    if (equals == absl::string_view::npos || section == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", number, ": not a 'key = value' line of a section"));
    }
    (*section)[absl::AsciiStrToLower(absl::StripAsciiWhitespace(text.substr(0, equals)))] =
        std::string(absl::StripAsciiWhitespace(text.substr(equals + 1)));
  }
  return file;
}

// Credentials from a section, if it holds any.
absl::StatusOr<std::optional<S3Credentials>> FromSection(const Section& section,
                                                         const std::string& source) {
  auto value = [&](const char* key) {
    auto it = section.find(key);
    return it == section.end() ? std::string() : it->second;
  };
  S3Credentials credentials{value("aws_access_key_id"), value("aws_secret_access_key"),
                            value("aws_session_token"), source};
  if (credentials.access_key_id.empty() && credentials.secret_access_key.empty()) {
    return std::optional<S3Credentials>();
  }
  if (credentials.access_key_id.empty() || credentials.secret_access_key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, " has ",
        credentials.access_key_id.empty() ? "a secret but no key id" : "a key id but no secret"));
  }
  return std::optional<S3Credentials>(std::move(credentials));
}

std::string ProfileOf(const S3CredentialOptions& options,
                      const std::function<std::optional<std::string>(const char*)>& env) {
  if (!options.profile.empty()) return options.profile;
  return env("AWS_PROFILE").value_or("default");
}

std::string HomeFile(const std::function<std::optional<std::string>(const char*)>& env,
                     const char* variable, const char* under_home) {
  if (std::optional<std::string> path = env(variable)) return *path;
  std::optional<std::string> home = env("HOME");
  return home ? absl::StrCat(*home, "/", under_home) : std::string();
}

// The config file names profiles "[profile NAME]", except the default one.
std::string ConfigSection(const std::string& profile) {
  return profile == "default" ? profile : absl::StrCat("profile ", profile);
}

absl::Status CheckOwnerOnly(const std::string& path) {
  struct stat info;
  if (::stat(path.c_str(), &info) != 0) return PosixError(absl::StrCat("reading ", path), errno);
  if ((info.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("the S3 credentials file ", path, " may be read or changed by others (mode ",
                     absl::StrFormat("%03o", info.st_mode & 0777),
                     "); make it readable by its owner only: chmod 600 ", path));
  }
  return absl::OkStatus();
}

}  // namespace

std::string S3Credentials::Describe() const {
  return absl::StrCat(access_key_id.substr(0, 4), "… from ", source);
}

absl::StatusOr<S3Credentials> ResolveS3Credentials(const S3CredentialOptions& options) {
  const auto env = EnvironmentOf(options);
  const std::string profile = ProfileOf(options, env);
  std::vector<std::string> looked_in;
  if (!options.credentials_file.empty()) {
    if (absl::Status s = CheckOwnerOnly(options.credentials_file); !s.ok()) return s;
    absl::StatusOr<IniFile> file = ReadIniFile(options.credentials_file);
    if (!file.ok()) return file.status();
    auto section = file->find(profile);
    if (section == file->end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the S3 credentials file ", options.credentials_file, " has no profile '", profile, "'"));
    }
    absl::StatusOr<std::optional<S3Credentials>> found = FromSection(
        section->second, absl::StrCat("profile '", profile, "' of ", options.credentials_file));
    if (!found.ok()) return found.status();
    if (*found) return **found;
    return absl::InvalidArgumentError(
        absl::StrCat("profile '", profile, "' of ", options.credentials_file, " holds no keys"));
  }

  Section from_env;
  for (const auto& [variable, key] : {std::pair{"AWS_ACCESS_KEY_ID", "aws_access_key_id"},
                                      std::pair{"AWS_SECRET_ACCESS_KEY", "aws_secret_access_key"},
                                      std::pair{"AWS_SESSION_TOKEN", "aws_session_token"}}) {
    if (std::optional<std::string> value = env(variable)) from_env[key] = *value;
  }
  absl::StatusOr<std::optional<S3Credentials>> found = FromSection(from_env, "the environment");
  if (!found.ok()) return found.status();
  if (*found) return **found;
  looked_in.push_back("the environment (AWS_ACCESS_KEY_ID)");

  for (const auto& [variable, under_home, section] :
       {std::tuple{"AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials", profile},
        std::tuple{"AWS_CONFIG_FILE", ".aws/config", ConfigSection(profile)}}) {
    const std::string path = HomeFile(env, variable, under_home);
    if (path.empty()) continue;
    looked_in.push_back(absl::StrCat("profile '", profile, "' of ", path));
    absl::StatusOr<IniFile> file = ReadIniFile(path);
    if (!file.ok()) {
      if (absl::IsNotFound(file.status())) continue;
      return file.status();
    }
    auto it = file->find(section);
    if (it == file->end()) continue;
    found = FromSection(it->second, absl::StrCat("profile '", profile, "' of ", path));
    if (!found.ok()) return found.status();
    if (*found) return **found;
  }
  return absl::NotFoundError(absl::StrCat("no S3 credentials: looked in ",
                                          absl::StrJoin(looked_in, ", "),
                                          " (or give --s3-credentials-file)"));
}

std::optional<std::string> ResolveS3Region(const S3CredentialOptions& options) {
  const auto env = EnvironmentOf(options);
  for (const char* variable : {"AWS_REGION", "AWS_DEFAULT_REGION"}) {
    if (std::optional<std::string> region = env(variable)) return region;
  }
  const std::string path = HomeFile(env, "AWS_CONFIG_FILE", ".aws/config");
  if (path.empty()) return std::nullopt;
  absl::StatusOr<IniFile> file = ReadIniFile(path);
  if (!file.ok()) return std::nullopt;
  auto section = file->find(ConfigSection(ProfileOf(options, env)));
  if (section == file->end()) return std::nullopt;
  auto region = section->second.find("region");
  if (region == section->second.end() || region->second.empty()) return std::nullopt;
  return region->second;
}

std::function<std::optional<std::string>(const char* name)> SnapshotS3Environment() {
  auto snapshot = std::make_shared<std::map<std::string, std::string>>();
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const absl::string_view text(*entry);
    const size_t equals = text.find('=');
    if (equals == absl::string_view::npos || !absl::StartsWith(text, "AWS_")) continue;
    if (equals + 1 < text.size()) {
      (*snapshot)[std::string(text.substr(0, equals))] = std::string(text.substr(equals + 1));
    }
  }
  return [snapshot](const char* name) -> std::optional<std::string> {
    if (absl::StartsWith(name, "AWS_")) {
      auto it = snapshot->find(name);
      if (it == snapshot->end()) return std::nullopt;
      return it->second;
    }
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') return std::nullopt;
    return std::string(value);
  };
}

void ForgetS3SecretsInEnvironment() {
  for (const char* name : {"AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}) {
    // The value's bytes first: unsetenv only unlinks the string, which stays in memory (and, for
    // the environment the process started with, in /proc/PID/environ).
    if (char* value = std::getenv(name); value != nullptr) {
      std::memset(value, 'x', std::strlen(value));
    }
    ::unsetenv(name);
  }
}

}  // namespace tierd

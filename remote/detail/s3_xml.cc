#include "remote/detail/s3_xml.h"

#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace tierd {
namespace {

// The text of the first <tag>…</tag> in `xml` at or after `*from`, and where it ends; nullopt
// when there is none.
std::optional<absl::string_view> Element(absl::string_view xml, absl::string_view tag,
                                         size_t* from) {
  const std::string open = absl::StrCat("<", tag, ">");
  const std::string close = absl::StrCat("</", tag, ">");
  const size_t start = xml.find(open, *from);
  if (start == absl::string_view::npos) return std::nullopt;
  const size_t text = start + open.size();
  const size_t end = xml.find(close, text);
  if (end == absl::string_view::npos) return std::nullopt;
  *from = end + close.size();
  return xml.substr(text, end - text);
}

std::optional<absl::string_view> Element(absl::string_view xml, absl::string_view tag) {
  size_t from = 0;
  return Element(xml, tag, &from);
}

// XML's five entities and numeric character references (as UTF-8).
absl::StatusOr<std::string> DecodeText(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  while (!text.empty()) {
    const size_t amp = text.find('&');
    const absl::string_view plain = text.substr(0, amp);
    out.append(plain.data(), plain.size());
    if (amp == absl::string_view::npos) break;
    text.remove_prefix(amp);
    const size_t semi = text.find(';');
    if (semi == absl::string_view::npos) return absl::DataLossError("an unterminated entity");
    const absl::string_view entity = text.substr(1, semi - 1);
    text.remove_prefix(semi + 1);
    if (entity == "amp") {
      out.push_back('&');
    } else if (entity == "lt") {
      out.push_back('<');
    } else if (entity == "gt") {
      out.push_back('>');
    } else if (entity == "quot") {
      out.push_back('"');
    } else if (entity == "apos") {
      out.push_back('\'');
    } else if (entity.size() > 1 && entity[0] == '#') {
      uint32_t code = 0;
      const bool hex = entity[1] == 'x' || entity[1] == 'X';
      const bool parsed = hex ? absl::SimpleHexAtoi(entity.substr(2), &code)
                              : absl::SimpleAtoi(entity.substr(1), &code);
      if (!parsed || code == 0 || code > 0x10FFFF) {
        return absl::DataLossError("a bad character reference");
      }
      if (code < 0x80) {
        out.push_back(static_cast<char>(code));
      } else if (code < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (code >> 6)));
        out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
      } else if (code < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (code >> 12)));
        out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
      } else {
        out.push_back(static_cast<char>(0xF0 | (code >> 18)));
        out.push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
      }
    } else {
      return absl::DataLossError("an unknown entity");
    }
  }
  return out;
}

}  // namespace

std::string UnquoteETag(absl::string_view etag) {
  etag = absl::StripAsciiWhitespace(etag);
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') {
    etag = etag.substr(1, etag.size() - 2);
  }
  return std::string(etag);
}

absl::StatusOr<S3ListPage> ParseS3ListPage(absl::string_view xml) {
  if (xml.find("<ListBucketResult") == absl::string_view::npos) {
    return absl::DataLossError("the answer to a listing is not a ListBucketResult");
  }
  S3ListPage page;
  size_t from = 0;
  while (std::optional<absl::string_view> contents = Element(xml, "Contents", &from)) {
    std::optional<absl::string_view> key = Element(*contents, "Key");
    std::optional<absl::string_view> size = Element(*contents, "Size");
    if (!key || !size) return absl::DataLossError("a listed object without its key or size");
    ListedObject object;
    absl::StatusOr<std::string> decoded = DecodeText(*key);
    if (!decoded.ok()) return decoded.status();
    object.key = *std::move(decoded);
    if (!absl::SimpleAtoi(*size, &object.size)) {
      return absl::DataLossError("a listed object's size is not a number");
    }
    if (std::optional<absl::string_view> etag = Element(*contents, "ETag")) {
      absl::StatusOr<std::string> text = DecodeText(*etag);
      if (!text.ok()) return text.status();
      object.etag = UnquoteETag(*text);
    }
    page.objects.push_back(std::move(object));
  }
  page.truncated = Element(xml, "IsTruncated").value_or("false") == "true";
  if (page.truncated) {
    std::optional<absl::string_view> token = Element(xml, "NextContinuationToken");
    if (!token || token->empty()) {
      return absl::DataLossError("a truncated listing without its continuation token");
    }
    absl::StatusOr<std::string> decoded = DecodeText(*token);
    if (!decoded.ok()) return decoded.status();
    page.next_continuation_token = *std::move(decoded);
  }
  return page;
}

namespace {

std::string ElementText(absl::string_view xml, absl::string_view tag) {
  std::optional<absl::string_view> text = Element(xml, tag);
  if (!text) return "";
  absl::StatusOr<std::string> decoded = DecodeText(*text);
  return decoded.ok() ? *decoded : "";
}

}  // namespace

std::string S3ErrorCode(absl::string_view xml) { return ElementText(xml, "Code"); }

std::string S3ErrorMessage(absl::string_view xml) { return ElementText(xml, "Message"); }

}  // namespace tierd

#include "core/error.h"

#include <utility>

namespace opforge {
namespace {

// `text` with every byte that is not part of valid UTF-8 written as \xNN: a
// message reaches Python as a str (a schema of a C++ library may hold any bytes).
std::string ValidUtf8(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = n > 0 && i + n <= text.size() && (n == 1 || c >= 0xC2) && c <= 0xF4;
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(text[i + k]) >> 6) == 0x2;
    if (ok && n > 2) {  // no overlong forms, surrogates or code points past U+10FFFF, as Python decodes
      const auto c1 = static_cast<unsigned char>(text[i + 1]);
      ok = !(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 >= 0xA0) && !(c == 0xF0 && c1 < 0x90) &&
           !(c == 0xF4 && c1 >= 0x90);
    }
    if (ok) {
      out.append(text, i, n);
      i += n;
    } else {
      static const char kHex[] = "0123456789abcdef";
      out += std::string("\\x") + kHex[c >> 4] + kHex[c & 0xF];
      ++i;
    }
  }
  return out;
}

std::string Compose(const std::string& op, const std::string& location,
                    const std::string& what, const std::string& fix) {
  std::string out;
  if (!op.empty()) out += op + ": ";
  if (!location.empty()) out += location + ": ";
  out += what;
  if (!fix.empty()) out += " " + fix;
  return ValidUtf8(out);
}

}  // namespace

Error::Error(ErrorKind kind, std::string op, std::string location, std::string what, std::string fix)
    : std::runtime_error(Compose(op, location, what, fix)),
      kind_(kind),
      op_(std::move(op)),
      location_(std::move(location)),
      what_(std::move(what)),
      fix_(std::move(fix)) {}

ParseError::ParseError(std::string source, size_t offset, std::string what, std::string unknown_type)
    : Error(ErrorKind::kValueError, "", "",
            what + " at offset " + std::to_string(offset) + ":\n  " + source +
                "\n  " + std::string(offset < source.size() ? offset : source.size(), ' ') + "^"),
      offset_(offset),
      unknown_type_(std::move(unknown_type)) {}

ParseError::ParseError(const ParseError& e, std::string op)
    : Error(ErrorKind::kValueError, std::move(op), "", e.what()),
      offset_(e.offset_),
      unknown_type_(e.unknown_type_) {}

}  // namespace opforge

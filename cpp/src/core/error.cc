#include "core/error.h"

#include <utility>

namespace opforge {
namespace {

std::string Compose(const std::string& op, const std::string& location,
                    const std::string& what, const std::string& fix) {
  std::string out;
  if (!op.empty()) out += op + ": ";
  if (!location.empty()) out += location + ": ";
  out += what;
  if (!fix.empty()) out += " " + fix;
  return out;
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

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

Error::Error(ErrorKind kind, std::string op, std::string location,
             std::string what, std::string fix)
    : std::runtime_error(Compose(op, location, what, fix)),
      kind_(kind),
      op_(std::move(op)),
      location_(std::move(location)),
      what_(std::move(what)),
      fix_(std::move(fix)) {}

ParseError::ParseError(std::string source, size_t offset, std::string what)
    : Error(ErrorKind::kValueError, "", "",
            what + " at offset " + std::to_string(offset) + ":\n  " + source +
                "\n  " + std::string(offset < source.size() ? offset : source.size(), ' ') + "^"),
      offset_(offset) {}

}  // namespace opforge

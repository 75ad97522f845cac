// Errors raised by the core. Front ends re-raise them as-is: the message
// already names the op, the location and the fix.
#pragma once

#include <stdexcept>
#include <string>

namespace opforge {

// Which Python exception a front end should raise for an error.
enum class ErrorKind { kTypeError, kValueError, kSyntaxError, kLookupError };

class Error : public std::runtime_error {
 public:
  // message: "<op>: <location>: <what> <fix>", each part optional.
  Error(ErrorKind kind, std::string op, std::string location, std::string what, std::string fix = "");

  ErrorKind kind() const { return kind_; }
  const std::string& op() const { return op_; }
  const std::string& location() const { return location_; }
  const std::string& detail() const { return what_; }
  const std::string& fix() const { return fix_; }

 private:
  ErrorKind kind_;
  std::string op_;
  std::string location_;
  std::string what_;
  std::string fix_;
};

// A schema string that does not parse. `offset` is the byte offset of the
// offending token.
class ParseError : public Error {
 public:
  ParseError(std::string source, size_t offset, std::string what, std::string unknown_type = "");
  // The same message, raised for op `op`: "<op>: <message>".
  ParseError(const ParseError& e, std::string op);
  size_t offset() const { return offset_; }
  // The type name that names nothing, when that is the error.
  const std::string& unknown_type() const { return unknown_type_; }

 private:
  size_t offset_;
  std::string unknown_type_;
};

}  // namespace opforge

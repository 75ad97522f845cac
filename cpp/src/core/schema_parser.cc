// A recursive-descent parser for torch's schema grammar. It follows torch's
// own parser (lexing of numbers and strings, default conversions, alias
// annotations) so that parsed schemas print exactly as torch prints them, and
// it additionally accepts torch's printed forms that torch cannot read back
// (`Device d=cpu`, `Tensor?(a)[]`).
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>
#include <unordered_set>

#include "core/error.h"
#include "core/schema.h"
#include "core/structs.h"

namespace opforge {
namespace {

enum TokenKind : int {
  kEof = 256,
  kIdent,
  kNumber,
  kString,
  kArrow,
  kDots,
  kNewline,
  kTrue,
  kFalse,
  kNone,
  kNoneType,
  kKeyword,  // a Python keyword torch's lexer reserves; never a name
};

struct Token {
  int kind;
  size_t begin;
  size_t end;
};

bool IsKeyword(std::string_view word) {
  static const std::unordered_set<std::string_view> kWords = {
      "def",   "if",     "else",   "elif",  "while",    "return", "is",
      "and",   "or",     "not",    "global", "for",     "in",     "raise",
      "assert", "break", "continue", "del", "pass",     "class",  "import",
      "with",  "as",     "Ellipsis"};
  return kWords.count(word) > 0;
}

// Characters torch's lexer accepts as single-character tokens.
bool IsSingleCharToken(char c) {
  static const std::string kChars = "+-*/%@()[]:,={}><.?!&^|~";
  return kChars.find(c) != std::string::npos;
}

class Lexer {
 public:
  explicit Lexer(std::string_view text) : src_(text) {
    // strtod needs a terminator; keep one past the end.
    src_.push_back('\0');
    int nesting = 0;
    do {
      tokens_.push_back(Next(tokens_.empty() ? 0 : tokens_.back().end, nesting));
    } while (tokens_.back().kind != kEof);
  }

  const Token& cur() const { return tokens_[index_]; }
  const Token& lookahead() const { return tokens_[index_ + 1 < tokens_.size() ? index_ + 1 : index_]; }
  std::string_view text(const Token& tok) const {
    return std::string_view(src_).substr(tok.begin, tok.end - tok.begin);
  }
  std::string_view source() const { return std::string_view(src_).substr(0, src_.size() - 1); }

  Token next() {
    Token tok = tokens_[index_];
    if (index_ + 1 < tokens_.size()) ++index_;
    return tok;
  }
  bool nextIf(int kind) {
    if (cur().kind != kind) return false;
    next();
    return true;
  }
  Token expect(int kind) {
    if (cur().kind != kind) Fail("expected " + KindName(kind) + " but found " + Describe(cur()));
    return next();
  }

  [[noreturn]] void Fail(const std::string& what) const { Fail(what, cur()); }
  [[noreturn]] void Fail(const std::string& what, const Token& at, std::string unknown_type = "") const {
    throw ParseError(std::string(source()), at.begin, what, std::move(unknown_type));
  }

  std::string Describe(const Token& tok) const {
    if (tok.kind == kEof) return "the end of the schema";
    if (tok.kind == kNewline) return "a newline";
    return "'" + std::string(text(tok)) + "'";
  }

  static std::string KindName(int kind) {
    switch (kind) {
      case kEof: return "the end of the schema";
      case kIdent: return "a name";
      case kNumber: return "a number";
      case kString: return "a string literal";
      case kArrow: return "'->'";
      case kDots: return "'...'";
      case kNone: return "'None'";
      default: return std::string("'") + static_cast<char>(kind) + "'";
    }
  }

 private:
  Token Next(size_t pos, int& nesting) {
    const char* s = src_.c_str();
    const size_t n = src_.size() - 1;
    while (true) {
      while (pos < n && s[pos] != '\n' && std::isspace(static_cast<unsigned char>(s[pos]))) ++pos;
      if (pos < n && s[pos] == '#') {
        while (pos < n && s[pos] != '\n') ++pos;
        continue;
      }
      if (pos + 1 < n && s[pos] == '\\' && s[pos + 1] == '\n') {
        pos += 2;
        continue;
      }
      if (pos < n && s[pos] == '\n') {
        if (nesting > 0) {
          ++pos;
          continue;
        }
        // Consecutive newlines and trailing blanks fold into one token.
        size_t end = pos;
        while (end < n && std::isspace(static_cast<unsigned char>(s[end]))) ++end;
        if (end == n) return {kEof, n, n};
        return {kNewline, pos, end};
      }
      break;
    }
    if (pos >= n) return {kEof, n, n};
    const char c = s[pos];
    // Numbers: whatever strtod reads, plus a trailing 'j' for complex.
    if (c != '-' && c != '+' && !std::isalpha(static_cast<unsigned char>(c))) {
      char* end = nullptr;
      std::strtod(s + pos, &end);
      size_t len = static_cast<size_t>(end - (s + pos));
      if (len > 0) {
        if (s[pos + len] == 'j') ++len;
        return {kNumber, pos, pos + len};
      }
    }
    if (c == '"' || c == '\'') return LexString(pos);
    // '$': the alias sets torch names for a bare `Tensor!` ("$0"), in its printed form.
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_' ||
        (c == '$' && pos + 1 < n && std::isdigit(static_cast<unsigned char>(s[pos + 1])))) {
      size_t end = pos + 1;
      while (end < n && (std::isalnum(static_cast<unsigned char>(s[end])) || s[end] == '_')) ++end;
      std::string_view word(s + pos, end - pos);
      int kind = kIdent;
      if (word == "True") kind = kTrue;
      else if (word == "False") kind = kFalse;
      else if (word == "None") kind = kNone;
      else if (word == "NoneType") kind = kNoneType;
      else if (IsKeyword(word)) kind = kKeyword;
      return {kind, pos, end};
    }
    if (c == '-' && pos + 1 < n && s[pos + 1] == '>') return {kArrow, pos, pos + 2};
    if (c == '.' && pos + 2 < n && s[pos + 1] == '.' && s[pos + 2] == '.') return {kDots, pos, pos + 3};
    if (IsSingleCharToken(c)) {
      if (c == '(' || c == '[' || c == '{') ++nesting;
      if ((c == ')' || c == ']' || c == '}') && nesting > 0) --nesting;
      return {c, pos, pos + 1};
    }
    throw ParseError(std::string(source()), pos, std::string("unexpected character '") + c + "'");
  }

  Token LexString(size_t start) {
    const std::string& s = src_;
    const size_t n = s.size() - 1;
    const std::string quotes(3, s[start]);
    // Whether `len` quote characters start at `at`.
    auto quotes_at = [&](size_t at, size_t len) { return at + len <= n && s.compare(at, len, quotes, 0, len) == 0; };
    const size_t quote_len = quotes_at(start, 3) ? 3 : 1;
    size_t end = start + quote_len;
    while (end < n && !quotes_at(end, quote_len)) {
      if (s[end] == '\n' && quote_len != 3) break;
      if (s[end] == '\\') ++end;
      ++end;
    }
    if (end >= n || !quotes_at(end, quote_len)) {
      throw ParseError(std::string(source()), start, "unterminated string literal");
    }
    return {kString, start, end + quote_len};
  }

  std::string src_;
  std::vector<Token> tokens_;
  size_t index_ = 0;
};

// torch's parseStringLiteral: strips quotes and resolves escapes.
std::string UnquoteString(const Lexer& L, const Token& tok) {
  std::string_view raw = L.text(tok);
  const size_t quote_len = raw.size() >= 6 && raw[0] == raw[1] && raw[1] == raw[2] ? 3 : 1;
  std::string out(raw.substr(quote_len, raw.size() - 2 * quote_len));
  constexpr std::string_view kLetters = "abfnvt";
  constexpr std::string_view kEscapes = "\a\b\f\n\v\t";
  size_t pos = out.find('\\');
  while (pos != std::string::npos) {
    if (pos + 1 >= out.size()) L.Fail("ill-formed escape in string literal", tok);
    char c = out[pos + 1];
    size_t erase = 2;
    switch (c) {
      case '\\': case '\'': case '"': case '\n': break;
      case 'x': L.Fail("unsupported hex specifier in string literal", tok);
      case 'u': case 'U': L.Fail("unsupported unicode specifier in string literal", tok);
      default: {
        if (const size_t k = kLetters.find(c); k != std::string_view::npos) {
          c = kEscapes[k];
          break;
        }
        // \nnn, three octal digits below 256.
        bool ok = pos + 3 < out.size();
        int value = 0;
        for (size_t i = 1; ok && i < 4; ++i) {
          char d = out[pos + i];
          ok = d >= '0' && d <= '7';
          value = value * 8 + (d - '0');
        }
        if (!ok || value >= 256) L.Fail("ill-formed octal specifier in string literal", tok);
        erase = 4;
        c = static_cast<char>(value);
      }
    }
    out.replace(pos, erase, 1, c);
    pos = out.find('\\', pos + 1);
  }
  return out;
}

// The kind torch converts defaults with: ScalarType, Layout and MemoryFormat
// defaults are ints, SymInt defaults ints.
TypeKind FakeKind(TypeKind kind) {
  switch (kind) {
    case TypeKind::kSymInt:
    case TypeKind::kScalarType:
    case TypeKind::kLayout:
    case TypeKind::kMemoryFormat:
      return TypeKind::kInt;
    case TypeKind::kSymBool:
      return TypeKind::kBool;
    default:
      return kind;
  }
}

class SchemaParser {
 public:
  SchemaParser(std::string_view text, const ParseOptions& options) : L(text), options_(options) {}

  FunctionSchema ParseDeclaration() {
    FunctionSchema schema;
    ParseName(schema);
    if (L.cur().kind != '(') {
      L.Fail("expected '(' after the operator name, but found " + L.Describe(L.cur()));
    }
    bool kwarg_only = false;
    ParseList('(', ',', ')', [&] {
      if (schema.is_vararg) L.Fail("'...' must be the last element of the argument list");
      if (L.nextIf('*')) {
        kwarg_only = true;
      } else if (L.nextIf(kDots)) {
        schema.is_vararg = true;
      } else {
        schema.arguments.push_back(ParseArgument(/*is_return=*/false, kwarg_only));
      }
    });
    if (schema.is_vararg && std::any_of(schema.arguments.begin(), schema.arguments.end(),
                                        [](const Argument& arg) { return arg.default_value.has_value(); })) {
      L.Fail("schemas with vararg (...) can't have default value args");
    }
    L.expect(kArrow);
    if (L.nextIf(kDots)) {
      schema.is_varret = true;
    } else if (L.cur().kind == '(') {
      ParseList('(', ',', ')', [&] {
        if (schema.is_varret) L.Fail("'...' must be the last element of the return list");
        if (L.nextIf(kDots)) {
          schema.is_varret = true;
        } else {
          schema.returns.push_back(ParseArgument(/*is_return=*/true, false));
        }
      });
    } else {
      schema.returns.push_back(ParseArgument(/*is_return=*/true, false));
    }
    L.nextIf(kNewline);
    if (L.cur().kind != kEof) L.Fail("expected the end of the schema but found " + L.Describe(L.cur()));
    if (!options_.allow_default_before_required) CheckDefaultOrder(schema);
    return schema;
  }

  TypePtr ParseWholeType() {
    auto [type, alias] = ParseType();
    if (L.nextIf('[')) {
      ToInt(L.expect(kNumber));
      L.expect(']');
      type = Type::List(type);
      if (L.nextIf('?')) type = Type::Optional(type);
    }
    if (alias) L.Fail("alias annotations are not allowed here");
    L.expect(kEof);
    return type;
  }

  Value ParseWholeDefault(const Type& type, std::optional<int32_t> N) {
    Value v = ParseDefaultValue(type, N);
    L.expect(kEof);
    return v;
  }

 private:
  template <typename F>
  void ParseList(int begin, int sep, int end, F&& callback) {
    L.expect(begin);
    if (L.cur().kind != end) {
      do {
        callback();
      } while (L.nextIf(sep));
    }
    L.expect(end);
  }

  std::string Ident() { return std::string(L.text(L.expect(kIdent))); }

  void ParseName(FunctionSchema& schema) {
    schema.name = Ident();
    if (L.nextIf(':')) {
      L.expect(':');
      schema.name += "::" + Ident();
    }
    if (L.nextIf('.')) {
      Token tok = L.cur();
      schema.overload = Ident();
      if (schema.overload == "default" || schema.overload.rfind("__", 0) == 0) {
        L.Fail("'" + schema.overload + "' is not a legal overload name", tok);
      }
    }
  }

  void CheckDefaultOrder(const FunctionSchema& schema) {
    bool seen_default = false;
    for (const auto& arg : schema.arguments) {
      if (arg.kwarg_only) continue;
      if (arg.default_value) {
        seen_default = true;
      } else if (seen_default) {
        throw ParseError(std::string(L.source()), 0,
                         "non-default positional argument '" + arg.name + "' follows an argument with a default");
      }
    }
  }

  Argument ParseArgument(bool is_return, bool kwarg_only) {
    Argument arg;
    auto [type, alias] = ParseType();
    if (L.nextIf('[')) {
      // A sized list `int[2]` only occurs at the argument level.
      type = Type::List(type);
      arg.N = static_cast<int32_t>(ToInt(L.expect(kNumber)));
      L.expect(']');
      alias = ListAlias(std::move(alias));
      if (L.nextIf('?')) type = Type::Optional(type);
    }
    arg.type = type;
    arg.alias_info = std::move(alias);
    if (is_return) {
      if (L.cur().kind == kIdent) arg.name = Ident();
    } else {
      arg.name = Ident();
      arg.kwarg_only = kwarg_only;
      if (L.nextIf('=')) arg.default_value = ParseDefaultValue(*arg.type, arg.N);
    }
    return arg;
  }

  std::pair<TypePtr, std::optional<AliasInfo>> ParseType() {
    TypePtr value;
    std::optional<AliasInfo> alias;
    const Token tok = L.cur();
    std::string_view word = tok.kind == kIdent ? L.text(tok) : std::string_view();
    if (tok.kind == '(') {
      std::vector<TypePtr> types;
      ParseList('(', ',', ')', [&] { types.push_back(ParseType().first); });
      value = Type::Composite(TypeKind::kTuple, std::move(types));
    } else if (word == "Future" || word == "RRef" || word == "Await") {
      L.next();
      L.expect('(');
      TypePtr sub = ParseType().first;
      L.expect(')');
      TypeKind kind = word == "Future" ? TypeKind::kFuture : word == "RRef" ? TypeKind::kRRef : TypeKind::kAwait;
      value = Type::Composite(kind, {sub});
    } else if (word == "Dict") {
      L.next();
      L.expect('(');
      TypePtr key = ParseType().first;
      L.expect(',');
      TypePtr val = ParseType().first;
      L.expect(')');
      alias = ParseAliasAnnotation();
      value = Type::Composite(TypeKind::kDict, {key, val});
    } else if (word == "Union") {
      L.next();
      std::vector<TypePtr> types;
      ParseList('(', ',', ')', [&] { types.push_back(ParseType().first); });
      value = Type::Composite(TypeKind::kUnion, std::move(types));
    } else if (word == "__torch__") {
      L.next();
      std::string name = "__torch__";
      // __torch__.torch.classes.<namespace>.<Name>; "" takes any name.
      for (const char* part : {"torch", "classes", "", ""}) {
        L.expect('.');
        const Token t = L.expect(kIdent);
        if (*part && L.text(t) != part) L.Fail("expected '" + std::string(part) + "' in a custom class name", t);
        name += "." + std::string(L.text(t));
      }
      value = Type::Named(TypeKind::kClass, name);
    } else if (options_.registry && word == "Literal" && L.lookahead().kind == '[') {
      value = ParseLiteral();
    } else if (options_.registry && word == "Handle" && L.lookahead().kind == '(') {
      L.next();
      L.expect('(');
      value = Type::Named(TypeKind::kHandle, DottedName());
      L.expect(')');
    } else {
      value = ParseBaseType();
      alias = ParseAliasAnnotation();
    }
    while (true) {
      if (L.cur().kind == '[' && L.lookahead().kind == ']') {
        L.next();
        L.next();
        value = Type::List(value);
        alias = ListAlias(std::move(alias));
      } else if (L.nextIf('?')) {
        value = Type::Optional(value);
        // torch prints `Tensor(a)?[]` as `Tensor?(a)[]`; read that back too.
        if (!alias && value->element().kind == TypeKind::kTensor && L.cur().kind == '(') {
          alias = ParseAliasAnnotation();
        }
      } else {
        break;
      }
    }
    return {value, std::move(alias)};
  }

  // The annotation after a list's `[]`, with the element's annotation inside
  // it; a list of written elements (`Tensor(a!)[]`) is itself written.
  std::optional<AliasInfo> ListAlias(std::optional<AliasInfo> element) {
    auto container = ParseAliasAnnotation();
    if (element) {
      if (!container) {
        container = AliasInfo();
        container->is_write = element->is_write;
      }
      container->contained.push_back(std::move(*element));
    }
    return container;
  }

  std::string DottedName() {
    std::string name = Ident();
    while (L.cur().kind == '.' && L.lookahead().kind == kIdent) {
      L.next();
      name += "." + Ident();
    }
    return name;
  }

  TypePtr ParseBaseType() {
    const Token tok = L.cur();
    if (L.nextIf(kNone) || L.nextIf(kNoneType)) return Type::Get(TypeKind::kNone);
    if (tok.kind != kIdent) L.Fail("expected a type but found " + L.Describe(tok));
    std::string name = options_.registry ? DottedName() : Ident();
    if (TypePtr leaf = LeafType(name)) return leaf;
    // Names torch's parser reads as other leaves (Dimname as str, as torch <= 2.12 does).
    if (name == "Dimname") return Type::Get(TypeKind::kStr);
    if (name == "ConstQuantizerPtr" || name == "DeviceIndex") return Type::Get(TypeKind::kInt);
    if (options_.registry) {
      // A library's own types first: `NormCfg` in library `liba` is `liba.NormCfg`.
      const std::string scoped = options_.scope.empty() ? name : options_.scope + "." + name;
      for (const std::string& full : {scoped, name}) {
        if (options_.registry->FindStruct(full)) return Type::Named(TypeKind::kStruct, full);
        if (options_.registry->FindEnum(full)) return Type::Named(TypeKind::kEnum, full);
      }
    }
    if (!name.empty() && std::islower(static_cast<unsigned char>(name[0])) && name.find('.') == std::string::npos) {
      return Type::Named(TypeKind::kVar, name);  // a type variable, as in torch
    }
    const char* hint = options_.registry ? "; register it as a struct or enum before using it in a schema" : "";
    L.Fail("unknown type '" + name + "'" + hint, tok, name);
  }

  TypePtr ParseLiteral() {
    const Token start = L.next();  // Literal
    std::vector<Value> values;
    ParseList('[', ',', ']', [&] {
      const Token tok = L.cur();
      if (tok.kind == kString) {
        values.push_back(Value::String(UnquoteString(L, L.next())));
      } else if (tok.kind == kNumber || tok.kind == '-') {
        bool negative = L.nextIf('-');
        int64_t v = ToInt(L.expect(kNumber));
        values.push_back(Value::Int(negative ? -v : v));
      } else {
        L.Fail("Literal values must be strings or integers, found " + L.Describe(tok));
      }
    });
    if (values.empty()) L.Fail("Literal[] needs at least one value", start);
    if (std::any_of(values.begin(), values.end(), [&](const Value& v) { return v.kind != values[0].kind; })) {
      L.Fail("Literal values must be all strings or all integers, not a mix", start);
    }
    return Type::Literal(std::move(values));
  }

  // Tensor(a), Tensor(a!), Tensor(a -> *), Tensor(a|b), Tensor!
  std::optional<AliasInfo> ParseAliasAnnotation() {
    AliasInfo info;
    auto add = [](std::vector<std::string>& sets, std::string name) {
      if (std::find(sets.begin(), sets.end(), name) == sets.end()) sets.push_back(std::move(name));
    };
    auto parse_sets = [&](std::vector<std::string>& sets) {
      bool wildcard = false;
      do {
        if (wildcard) L.Fail("nothing may follow the wildcard '*' in an alias set");
        if (L.nextIf('*')) {
          add(sets, "*");
          wildcard = true;
        } else {
          add(sets, Ident());
        }
      } while (L.nextIf('|'));
    };
    if (L.nextIf('(')) {
      parse_sets(info.before_sets);
      if (L.nextIf('!')) info.is_write = true;
      if (L.nextIf(kArrow)) {
        // `Tensor($0! -> )`: torch prints a bare `Tensor!` with no after set.
        if (L.cur().kind != ')') parse_sets(info.after_sets);
      } else {
        info.after_sets = info.before_sets;
      }
      L.expect(')');
    } else if (L.nextIf('!')) {
      info.before_sets.push_back("$" + std::to_string(fresh_alias_++));
      info.is_write = true;
    } else {
      return std::nullopt;
    }
    return info;
  }

  int64_t ToInt(const Token& tok) {
    std::string text(L.text(tok));
    try {
      return std::stoll(text);
    } catch (const std::exception&) {
      L.Fail("'" + text + "' is not a valid integer", tok);
    }
  }

  Value ParseSingleConstant(TypeKind kind) {
    const Token tok = L.cur();
    switch (tok.kind) {
      case kTrue: L.next(); return Value::Bool(true);
      case kFalse: L.next(); return Value::Bool(false);
      case kNone: L.next(); return Value::None();
      case kString: L.next(); return Value::String(UnquoteString(L, tok));
      case kIdent: {
        L.next();
        std::string_view text = L.text(tok);
        // The named constants torch's parser knows, as their enum values.
        if (text == "float") return Value::Int(6);              // at::kFloat
        if (text == "complex") return Value::Int(9);            // at::kComplexFloat
        if (text == "long") return Value::Int(4);               // at::kLong
        if (text == "strided") return Value::Int(0);            // at::kStrided
        if (text == "Mean") return Value::Int(1);               // at::Reduction::Mean
        if (text == "contiguous_format") return Value::Int(0);  // MemoryFormat::Contiguous
        L.Fail("invalid default value '" + std::string(text) + "'", tok);
      }
      default: break;
    }
    std::string n;
    if (L.nextIf('-')) n = "-";
    const Token num = L.cur();
    if (num.kind != kNumber) L.Fail("expected a default value but found " + L.Describe(num));
    L.next();
    n += std::string(L.text(num));
    // torch prints complex defaults as `0.+1.j`; read that form back.
    if ((L.cur().kind == '+' || L.cur().kind == '-') && L.lookahead().kind == kNumber &&
        L.text(L.lookahead()).back() == 'j') {
      const bool minus = L.next().kind == '-';
      std::string imag(L.text(L.next()));
      try {
        double im = std::stod(imag.substr(0, imag.size() - 1));
        return Value::Complex(std::stod(n), minus ? -im : im);
      } catch (const std::exception&) {
        L.Fail("'" + n + "+" + imag + "' is not a valid complex number", num);
      }
    }
    try {
      if (kind == TypeKind::kComplex || n.find('j') != std::string::npos) {
        return Value::Complex(0.0, std::stod(n.substr(0, n.size() - 1)));
      }
      if (kind == TypeKind::kFloat || n.find('.') != std::string::npos || n.find('e') != std::string::npos) {
        return Value::Double(std::stod(n));
      }
      return Value::Int(std::stoll(n));
    } catch (const std::exception&) {
      L.Fail("'" + n + "' is not a valid number for this argument", num);
    }
  }

  Value ConvertToList(TypeKind kind, const Token& at, std::vector<Value> items) {
    Value::Kind want;
    switch (kind) {
      case TypeKind::kComplex: want = Value::Kind::kComplex; break;
      case TypeKind::kFloat: want = Value::Kind::kDouble; break;
      case TypeKind::kInt: want = Value::Kind::kInt; break;
      case TypeKind::kBool: want = Value::Kind::kBool; break;
      default:
        L.Fail("list defaults are only supported for int, float, bool and complex lists", at);
    }
    for (const auto& item : items) {
      if (item.kind != want) L.Fail("list default holds a value of the wrong type", at);
    }
    return Value::List(std::move(items));
  }

  // The kind a default is converted with; enums and Literals by their values.
  TypeKind DefaultKind(const Type& type) const {
    if (type.kind == TypeKind::kLiteral) {
      return type.literals[0].kind == Value::Kind::kString ? TypeKind::kStr : TypeKind::kInt;
    }
    if (type.kind == TypeKind::kEnum && options_.registry) {
      if (auto e = options_.registry->FindEnum(type.name)) return e->value_kind();
    }
    return FakeKind(type.kind);
  }

  // Whether a default of kind `v` is a value of scalar kind `kind`: None gets
  // its own message later; an int or a complex stands for a float, as in torch.
  static bool DefaultFits(TypeKind kind, Value::Kind v) {
    using K = Value::Kind;
    switch (kind) {
      case TypeKind::kStr: return v == K::kString || v == K::kNone;
      case TypeKind::kInt: return v == K::kInt || v == K::kNone;
      case TypeKind::kBool: return v == K::kBool || v == K::kInt || v == K::kNone;
      default: return v != K::kString && v != K::kBool;  // kFloat
    }
  }

  Value ParseDefaultValue(const Type& type, std::optional<int32_t> N) {
    const Token at = L.cur();
    if (options_.registry) {
      if (auto v = ParseExtensionDefault(type)) return *v;
    }
    // torch prints `Device? d="cuda:1"` as `Device? d=cuda:1`; read it back
    // as the string torch holds for the quoted form.
    if (type.is_optional() && type.element().kind == TypeKind::kDevice && L.cur().kind == kIdent) {
      return Value::String(ParseDeviceDefault().s);
    }
    const TypeKind kind = FakeKind(type.kind);
    switch (kind) {
      case TypeKind::kTensor:
      case TypeKind::kGenerator:
      case TypeKind::kQuantizer:
        L.expect(kNone);
        return Value::None();
      case TypeKind::kOptional:
      case TypeKind::kScalar:
      case TypeKind::kComplex:
        return ParseSingleConstant(kind);
      case TypeKind::kStr:
      case TypeKind::kInt:
      case TypeKind::kBool:
      case TypeKind::kFloat: {
        // torch's parser takes `int n=1.5` and fails at the op's first call
        // (an internal assert); a default must be a value of its type.
        Value v = ParseSingleConstant(kind);
        if (options_.check_default_types && !DefaultFits(kind, v.kind)) {
          const std::string text(L.source().substr(at.begin, L.cur().begin - at.begin));
          L.Fail("the default '" + text + "' is not a value of type " + TypeStr(type), at);
        }
        return v;
      }
      case TypeKind::kDevice:
        return ParseDeviceDefault();
      case TypeKind::kList: {
        const TypeKind elem = DefaultKind(type.element());
        // As in torch: a list default is a list or a single repeated value;
        // `None` is not accepted for a non-optional list.
        if (L.cur().kind == kIdent) L.expect(kNone);
        if (N && L.cur().kind != '[') {
          return ConvertToList(elem, at, std::vector<Value>(static_cast<size_t>(*N), ParseSingleConstant(elem)));
        }
        std::vector<Value> items;
        ParseList('[', ',', ']', [&] { items.push_back(ParseSingleConstant(elem)); });
        return ConvertToList(elem, at, std::move(items));
      }
      default:
        L.Fail("arguments of type " + TypeStr(type) + " cannot have a default value", at);
    }
  }

  // torch writes a device default as a string literal and prints it bare
  // (`Device d=cpu`); accept both.
  Value ParseDeviceDefault() {
    const Token tok = L.cur();
    std::string text;
    if (tok.kind == kString) {
      text = UnquoteString(L, L.next());
    } else if (tok.kind == kIdent) {
      text = std::string(L.text(L.next()));
      if (L.cur().kind == ':' && L.lookahead().kind == kNumber) {
        L.next();
        text += ":" + std::string(L.text(L.next()));
      }
    } else {
      L.Fail("expected a device such as \"cpu\" or \"cuda:0\" but found " + L.Describe(tok));
    }
    // `type` or `type:index`; without an index the type alone is checked.
    const size_t colon = text.find(':');
    const std::string kind = text.substr(0, colon);
    const std::string index = colon == std::string::npos ? "0" : text.substr(colon + 1);
    const auto lower = [](char c) { return std::islower(static_cast<unsigned char>(c)) || c == '_'; };
    const auto digit = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; };
    const bool ok = !kind.empty() && !index.empty() && index.size() < 4 &&
                    std::all_of(kind.begin(), kind.end(), lower) && std::all_of(index.begin(), index.end(), digit);
    if (!ok) L.Fail("invalid device string '" + text + "'", tok);
    return Value::Device(text);
  }

  // Defaults of opforge's extension types; nullopt when `type` is not one.
  std::optional<Value> ParseExtensionDefault(const Type& type) {
    const Type& unopt = type.unwrap_optional();
    switch (unopt.kind) {
      case TypeKind::kStruct: {
        if (L.nextIf(kNone)) return Value::None();
        auto def = options_.registry->FindStruct(unopt.name);
        std::vector<std::string> names;
        std::vector<Value> values;
        ParseList('{', ',', '}', [&] {
          const Token name_tok = L.cur();
          std::string name = Ident();
          const StructField* field = def->Find(name);
          if (!field) L.Fail("struct " + unopt.name + " has no field '" + name + "'", name_tok);
          if (std::find(names.begin(), names.end(), name) != names.end()) {
            L.Fail("field '" + name + "' given twice", name_tok);
          }
          L.expect('=');
          names.push_back(name);
          values.push_back(ParseDefaultValue(*field->type, std::nullopt));
        });
        return Value::Struct(std::move(names), std::move(values));
      }
      case TypeKind::kEnum:
      case TypeKind::kLiteral:
        if (L.nextIf(kNone)) return Value::None();
        if (unopt.kind == TypeKind::kEnum && L.cur().kind == kIdent) {
          // A member name: `Mode mode=FAST`.
          auto def = options_.registry->FindEnum(unopt.name);
          const Token tok = L.next();
          const auto it = std::find(def->members.begin(), def->members.end(), L.text(tok));
          if (it != def->members.end()) return def->values[static_cast<size_t>(it - def->members.begin())];
          L.Fail("enum " + unopt.name + " has no member '" + std::string(L.text(tok)) + "'", tok);
        }
        return ParseSingleConstant(DefaultKind(unopt));
      case TypeKind::kHandle:
        L.expect(kNone);
        return Value::None();
      default:
        return std::nullopt;
    }
  }

  Lexer L;
  const ParseOptions& options_;
  int fresh_alias_ = 0;
};

}  // namespace

FunctionSchema ParseSchema(std::string_view text, const ParseOptions& options) {
  return SchemaParser(text, options).ParseDeclaration();
}

TypePtr ParseType(std::string_view text, const ParseOptions& options) {
  return SchemaParser(text, options).ParseWholeType();
}

Value ParseDefault(std::string_view text, const Type& type, std::optional<int32_t> N, const ParseOptions& options) {
  return SchemaParser(text, options).ParseWholeDefault(type, N);
}

}  // namespace opforge

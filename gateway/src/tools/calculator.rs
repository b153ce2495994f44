//! `calculator`: arithmetic on 64-bit floats with Python's operators and precedence (seed 000).
//!
//! The seed evaluates a Python AST; here a small parser of our own accepts exactly this
//! grammar and nothing else (no other names, no attribute access, strings, subscripts,
//! comparisons, assignments or statements):
//!
//! ```text
//! expr    := term (('+' | '-') term)*
//! term    := factor (('*' | '/' | '//' | '%') factor)*
//! factor  := ('+' | '-')* power
//! power   := primary ('**' factor)?
//! primary := NUMBER | 'pi' | 'e' | '(' expr ')'
//!          | FUNCTION '(' expr (',' expr)* ','? ')'
//! FUNCTION := sqrt | sin | cos | tan | log | log10 | exp | abs | round
//! ```
//!
//! So `**` is right-associative and binds tighter than a unary minus on its left
//! (`-2**2 == -4`) but accepts one on its right (`2**-1 == 0.5`).
//!
//! Bounds: an expression is at most [`MAX_EXPRESSION_CHARS`] characters (the schema says so
//! too, and [`evaluate`] checks again for callers that bypass the schema); parentheses and
//! calls nest at most [`MAX_DEPTH`] deep, checked before descending, and they are the only
//! places the parser recurses (sign runs and `**` chains are loops). The parser compiles to
//! postfix code that [`Program::eval`] runs in a loop over a value stack, so work and memory
//! are linear in the length of the input and nothing recurses on the input's shape.
//!
//! Errors: syntax and disallowed constructs are INVALID_ARGUMENTS ("Invalid expression: ...
//! at column N", columns counted in characters from 1); division or modulo by zero is
//! DIVISION_BY_ZERO ("Division by zero"); domain errors and any non-finite intermediate
//! result are MATH_ERROR ("Math error: ...").

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::error::{ErrorCode, ToolError};
use crate::tool::{CallContext, Category, ToolMetadata, TypedTool};

/// Longest expression accepted, in characters (seed 000's `max_length=1000`).
pub const MAX_EXPRESSION_CHARS: usize = 1000;

/// Deepest nesting of parentheses and function calls.
pub const MAX_DEPTH: usize = 64;

/// Names a model may use, for error messages.
const ALLOWED: &str =
    "constants pi and e; functions sqrt, sin, cos, tan, log, log10, exp, abs, round";

/// Arguments of `calculator`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CalculatorInput {
    /// Arithmetic expression with Python's operators and precedence: numbers, `+ - * / // % **`,
    /// parentheses, constants `pi` and `e`, functions `sqrt sin cos tan log log10 exp abs round`
    /// (`log(x, base)` and `round(x, digits)` take an optional second argument).
    #[schemars(length(max = 1000), extend("examples" = ["2 + 2", "sqrt(16)", "sin(pi/2)", "2**10"]))]
    pub expression: String,
}

/// Output of `calculator`.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct CalculatorOutput {
    /// The result as a 64-bit float (always finite).
    pub value: f64,
    /// The result for people: all integer digits when it is a whole number (`"4"`), otherwise
    /// 10 significant digits (Python's `{:.10g}`).
    pub formatted: String,
}

/// The calculator tool.
pub struct Calculator;

impl TypedTool for Calculator {
    type Input = CalculatorInput;
    type Output = CalculatorOutput;

    fn metadata(&self) -> ToolMetadata {
        ToolMetadata::pure_inline(
            "calculator",
            "Calculator",
            "Evaluates an arithmetic expression safely, with Python's operators and \
                precedence: numbers, + - * / // % ** and parentheses, the constants pi and e, and \
                the functions sqrt, sin, cos, tan, log (log(x) or log(x, base)), log10, exp, abs \
                and round (round(x) or round(x, digits)). Returns the value and a formatted string.",
            Category::Computation,
        )
    }

    /// Seed 000's `tools.yaml` gives the calculator 1000 ms.
    fn default_timeout_ms(&self) -> u64 {
        1000
    }

    async fn run(
        &self,
        input: CalculatorInput,
        _ctx: &CallContext,
    ) -> Result<CalculatorOutput, ToolError> {
        let value = evaluate(&input.expression)?;
        Ok(CalculatorOutput {
            value,
            formatted: format_number(value),
        })
    }
}

/// Checks the length, parses and evaluates `expression`. The result is finite; `-0` is `0`.
pub fn evaluate(expression: &str) -> Result<f64, ToolError> {
    // Bytes bound characters from above, so only long inputs are counted, and only as far
    // as the limit.
    if expression.len() > MAX_EXPRESSION_CHARS
        && expression.chars().take(MAX_EXPRESSION_CHARS + 1).count() > MAX_EXPRESSION_CHARS
    {
        return Err(ToolError::invalid_arguments(format!(
            "Invalid expression: longer than {MAX_EXPRESSION_CHARS} characters"
        )));
    }
    let value = parse(expression)?.eval()?;
    Ok(if value == 0.0 { 0.0 } else { value })
}

/// Formats a result like the seed: `str(int(v))` for whole numbers (every integer digit of
/// the float, e.g. `"4"`, `"1000000000000000000000"`), otherwise Python's `{:.10g}`.
pub fn format_number(v: f64) -> String {
    if !v.is_finite() {
        // Never produced by `evaluate`; kept total for other callers.
        return v.to_string();
    }
    if v == v.trunc() {
        if v == 0.0 {
            return "0".to_string();
        }
        // Exact decimal expansion of the (integral) float, as Python's int() would give.
        return format!("{v:.0}");
    }
    // `{:.9e}` rounds to 10 significant digits (ties to even on the exact binary value, like
    // Python) and tells the decimal exponent after rounding, which picks %g's style.
    let sci = format!("{v:.9e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..10).contains(&exp) {
        let decimals = usize::try_from(9 - exp).unwrap_or(0);
        strip_fraction_zeros(&format!("{v:.decimals$}")).to_string()
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!(
            "{}e{sign}{:02}",
            strip_fraction_zeros(mantissa),
            exp.unsigned_abs()
        )
    }
}

fn strip_fraction_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

/// A parsed expression: postfix code for [`Program::eval`].
#[derive(Debug, Clone)]
pub struct Program {
    code: Vec<Op>,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    /// Push a finite number.
    Num(f64),
    /// A literal too large for a float (e.g. `1e999`), at this column.
    HugeLiteral(usize),
    /// Negate the top of the stack.
    Neg,
    /// Pop b, pop a, push `a op b`; the operator's column.
    Bin(BinOp, usize),
    /// Pop the arguments, push the result; argument count and the name's column.
    Call(Func, usize, usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    FloorDiv,
    Mod,
    Pow,
}

impl BinOp {
    fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::FloorDiv => "//",
            BinOp::Mod => "%",
            BinOp::Pow => "**",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Func {
    Sqrt,
    Sin,
    Cos,
    Tan,
    Log,
    Log10,
    Exp,
    Abs,
    Round,
}

impl Func {
    fn by_name(name: &str) -> Option<Func> {
        Some(match name {
            "sqrt" => Func::Sqrt,
            "sin" => Func::Sin,
            "cos" => Func::Cos,
            "tan" => Func::Tan,
            "log" => Func::Log,
            "log10" => Func::Log10,
            "exp" => Func::Exp,
            "abs" => Func::Abs,
            "round" => Func::Round,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Func::Sqrt => "sqrt",
            Func::Sin => "sin",
            Func::Cos => "cos",
            Func::Tan => "tan",
            Func::Log => "log",
            Func::Log10 => "log10",
            Func::Exp => "exp",
            Func::Abs => "abs",
            Func::Round => "round",
        }
    }

    /// Fewest and most arguments.
    fn arity(self) -> (usize, usize) {
        match self {
            Func::Log | Func::Round => (1, 2),
            _ => (1, 1),
        }
    }
}

/// Python keywords, named as such in errors (`import os`, `lambda: 0`).
const KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];

fn invalid(column: usize, message: impl fmt::Display) -> ToolError {
    ToolError::invalid_arguments(format!("Invalid expression: {message} at column {column}"))
        .with_details(json!({ "column": column }))
}

/// Like [`invalid`], with the allowed names after the column.
fn not_allowed(column: usize, message: impl fmt::Display) -> ToolError {
    ToolError::invalid_arguments(format!(
        "Invalid expression: {message} at column {column} (allowed: {ALLOWED})"
    ))
    .with_details(json!({ "column": column }))
}

fn math_error(column: usize, message: impl fmt::Display) -> ToolError {
    ToolError::new(
        ErrorCode::MathError,
        format!("Math error: {message} at column {column}"),
    )
    .with_details(json!({ "column": column }))
}

fn division_by_zero(column: usize, message: Option<&str>) -> ToolError {
    let text = match message {
        None => "Division by zero".to_string(),
        Some(m) => format!("Division by zero: {m} at column {column}"),
    };
    ToolError::new(ErrorCode::DivisionByZero, text).with_details(json!({ "column": column }))
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Tok<'a> {
    /// A number literal's value (infinite when the literal overflows).
    Num(f64),
    Name(&'a str),
    Plus,
    Minus,
    Star,
    StarStar,
    Slash,
    SlashSlash,
    Percent,
    LParen,
    RParen,
    Comma,
    End,
}

impl fmt::Display for Tok<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Num(_) => f.write_str("a number"),
            Tok::Name(n) => write!(f, "name '{n}'"),
            Tok::Plus => f.write_str("'+'"),
            Tok::Minus => f.write_str("'-'"),
            Tok::Star => f.write_str("'*'"),
            Tok::StarStar => f.write_str("'**'"),
            Tok::Slash => f.write_str("'/'"),
            Tok::SlashSlash => f.write_str("'//'"),
            Tok::Percent => f.write_str("'%'"),
            Tok::LParen => f.write_str("'('"),
            Tok::RParen => f.write_str("')'"),
            Tok::Comma => f.write_str("','"),
            Tok::End => f.write_str("the end of the expression"),
        }
    }
}

/// Splits the input into tokens on demand. Everything it accepts is ASCII, so a byte offset
/// plus one is the character column.
struct Lexer<'a> {
    src: &'a str,
    pos: usize,
}

impl<'a> Lexer<'a> {
    fn peek_at(&self, i: usize) -> Option<u8> {
        self.src.as_bytes().get(i).copied()
    }

    /// Whether the next token is '(' (without consuming anything).
    fn next_is_lparen(&self) -> bool {
        self.src.as_bytes()[self.pos.min(self.src.len())..]
            .iter()
            .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
            == Some(&b'(')
    }

    /// The next token and its column.
    fn next_token(&mut self) -> Result<(Tok<'a>, usize), ToolError> {
        while matches!(self.peek_at(self.pos), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
        let start = self.pos;
        let col = start + 1;
        let Some(c) = self.peek_at(start) else {
            return Ok((Tok::End, col));
        };
        let next = self.peek_at(start + 1);
        let (tok, len) = match c {
            b'0'..=b'9' => return self.number(start),
            b'.' if next.is_some_and(|n| n.is_ascii_digit()) => return self.number(start),
            b'.' => return Err(invalid(col, "attribute access ('.') is not allowed")),
            b'a'..=b'z' | b'A'..=b'Z' | b'_' => {
                let mut end = start + 1;
                while self
                    .peek_at(end)
                    .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
                {
                    end += 1;
                }
                self.pos = end;
                return Ok((Tok::Name(&self.src[start..end]), col));
            }
            b'+' => (Tok::Plus, 1),
            b'-' => (Tok::Minus, 1),
            b'*' if next == Some(b'*') => (Tok::StarStar, 2),
            b'*' => (Tok::Star, 1),
            b'/' if next == Some(b'/') => (Tok::SlashSlash, 2),
            b'/' => (Tok::Slash, 1),
            b'%' => (Tok::Percent, 1),
            b'(' => (Tok::LParen, 1),
            b')' => (Tok::RParen, 1),
            b',' => (Tok::Comma, 1),
            b'\'' | b'"' => return Err(invalid(col, "strings are not allowed")),
            b'=' if next == Some(b'=') => {
                return Err(invalid(col, "comparisons ('==') are not supported"));
            }
            b'=' => return Err(invalid(col, "assignment ('=') is not allowed")),
            b'<' | b'>' | b'!' => return Err(invalid(col, "comparisons are not supported")),
            b'[' | b']' | b'{' | b'}' => {
                return Err(invalid(
                    col,
                    format!(
                        "'{}': lists, subscripts, sets and dicts are not supported",
                        c as char
                    ),
                ));
            }
            b'&' | b'|' | b'^' | b'~' | b'@' => {
                return Err(invalid(
                    col,
                    format!("operator '{}' is not supported", c as char),
                ));
            }
            b';' => return Err(invalid(col, "';': only a single expression is allowed")),
            _ => {
                let ch = self.src[start..].chars().next().unwrap_or('?');
                return Err(invalid(col, format!("unexpected character {ch:?}")));
            }
        };
        self.pos = start + len;
        Ok((tok, col))
    }

    /// A decimal literal: `1`, `1.5`, `1.`, `.5`, `1e3`, `2.5E-3`.
    fn number(&mut self, start: usize) -> Result<(Tok<'a>, usize), ToolError> {
        let col = start + 1;
        let digits = |lexer: &Self, mut i: usize| {
            while lexer.peek_at(i).is_some_and(|b| b.is_ascii_digit()) {
                i += 1;
            }
            i
        };
        let mut end = digits(self, start);
        let mut integer = true;
        if self.peek_at(end) == Some(b'.') {
            integer = false;
            end = digits(self, end + 1);
        }
        if matches!(self.peek_at(end), Some(b'e' | b'E')) {
            integer = false;
            let mut i = end + 1;
            if matches!(self.peek_at(i), Some(b'+' | b'-')) {
                i += 1;
            }
            let exp_end = digits(self, i);
            if exp_end == i {
                return Err(invalid(col, "malformed number (exponent without digits)"));
            }
            end = exp_end;
        }
        if self
            .peek_at(end)
            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
        {
            return Err(invalid(
                col,
                "invalid number literal (only decimal numbers like 12, 1.5, .5 or 1e3)",
            ));
        }
        let text = &self.src[start..end];
        if integer && text.len() > 1 && text.starts_with('0') && text.bytes().any(|b| b != b'0') {
            return Err(invalid(col, "leading zeros are not allowed in integers"));
        }
        let value: f64 = text.parse().map_err(|_| invalid(col, "malformed number"))?;
        self.pos = end;
        Ok((Tok::Num(value), col))
    }
}

struct Parser<'a> {
    lexer: Lexer<'a>,
    tok: Tok<'a>,
    col: usize,
    depth: usize,
    code: Vec<Op>,
}

/// Parses `expression` into a [`Program`]. Does not check the length: work is linear in
/// it and recursion is bounded by [`MAX_DEPTH`] whatever it is.
pub fn parse(expression: &str) -> Result<Program, ToolError> {
    let mut p = Parser {
        lexer: Lexer {
            src: expression,
            pos: 0,
        },
        tok: Tok::End,
        col: 1,
        depth: 0,
        code: Vec::new(),
    };
    p.advance()?;
    if p.tok == Tok::End {
        return Err(ToolError::invalid_arguments(
            "Invalid expression: the expression is empty",
        ));
    }
    p.expr()?;
    match p.tok {
        Tok::End => Ok(Program { code: p.code }),
        Tok::RParen => Err(invalid(p.col, "unmatched ')'")),
        Tok::Comma => Err(invalid(
            p.col,
            "',' outside a function call (only one expression is allowed)",
        )),
        Tok::LParen => Err(invalid(
            p.col,
            "unexpected '(' (only the listed functions can be called; write '*' to multiply)",
        )),
        other => Err(invalid(
            p.col,
            format!("unexpected {other}, expected an operator"),
        )),
    }
}

impl<'a> Parser<'a> {
    fn advance(&mut self) -> Result<(), ToolError> {
        let (tok, col) = self.lexer.next_token()?;
        self.tok = tok;
        self.col = col;
        Ok(())
    }

    /// Enters a parenthesis or call at `col`, failing past the nesting bound.
    fn enter(&mut self, col: usize) -> Result<(), ToolError> {
        if self.depth >= MAX_DEPTH {
            return Err(invalid(
                col,
                format!("parentheses and calls nest deeper than {MAX_DEPTH} levels"),
            ));
        }
        self.depth += 1;
        Ok(())
    }

    fn expr(&mut self) -> Result<(), ToolError> {
        self.term()?;
        loop {
            let op = match self.tok {
                Tok::Plus => BinOp::Add,
                Tok::Minus => BinOp::Sub,
                _ => return Ok(()),
            };
            let col = self.col;
            self.advance()?;
            self.term()?;
            self.code.push(Op::Bin(op, col));
        }
    }

    fn term(&mut self) -> Result<(), ToolError> {
        self.factor()?;
        loop {
            let op = match self.tok {
                Tok::Star => BinOp::Mul,
                Tok::Slash => BinOp::Div,
                Tok::SlashSlash => BinOp::FloorDiv,
                Tok::Percent => BinOp::Mod,
                _ => return Ok(()),
            };
            let col = self.col;
            self.advance()?;
            self.factor()?;
            self.code.push(Op::Bin(op, col));
        }
    }

    /// A run of signs; true when it negates.
    fn signs(&mut self) -> Result<bool, ToolError> {
        let mut negate = false;
        loop {
            match self.tok {
                Tok::Plus => {}
                Tok::Minus => negate = !negate,
                _ => return Ok(negate),
            }
            self.advance()?;
        }
    }

    /// `factor := sign* primary ('**' sign* primary)*`, with `**` folded from the right and
    /// each sign run applying to everything to its right: `a ** -b ** c` is `a ** -(b ** c)`.
    fn factor(&mut self) -> Result<(), ToolError> {
        let negate = self.signs()?;
        self.primary()?;
        let mut exponents: Vec<(bool, usize)> = Vec::new();
        while self.tok == Tok::StarStar {
            let col = self.col;
            self.advance()?;
            let negate_exponent = self.signs()?;
            self.primary()?;
            exponents.push((negate_exponent, col));
        }
        for (negate_exponent, col) in exponents.into_iter().rev() {
            if negate_exponent {
                self.code.push(Op::Neg);
            }
            self.code.push(Op::Bin(BinOp::Pow, col));
        }
        if negate {
            self.code.push(Op::Neg);
        }
        Ok(())
    }

    fn primary(&mut self) -> Result<(), ToolError> {
        let col = self.col;
        match self.tok {
            Tok::Num(v) => {
                self.code.push(if v.is_finite() {
                    Op::Num(v)
                } else {
                    Op::HugeLiteral(col)
                });
                self.advance()
            }
            Tok::LParen => {
                self.enter(col)?;
                self.advance()?;
                self.expr()?;
                if self.tok != Tok::RParen {
                    return Err(invalid(
                        self.col,
                        format!(
                            "expected ')' to close '(' from column {col}, found {}",
                            self.tok
                        ),
                    ));
                }
                self.depth -= 1;
                self.advance()
            }
            Tok::Name(name) => {
                // Decide on the name before lexing on, so `os.system` reports `os`.
                if self.lexer.next_is_lparen() {
                    self.advance()?;
                    self.call(name, col)
                } else {
                    let value = match name {
                        "pi" => std::f64::consts::PI,
                        "e" => std::f64::consts::E,
                        _ if Func::by_name(name).is_some() => {
                            return Err(invalid(
                                col,
                                format!("'{name}' is a function; call it like {name}(x)"),
                            ));
                        }
                        _ => return Err(unknown_name(name, col)),
                    };
                    self.code.push(Op::Num(value));
                    self.advance()
                }
            }
            Tok::End => Err(invalid(
                col,
                "unexpected end of the expression, expected a number, a name or '('",
            )),
            other => Err(invalid(
                col,
                format!("unexpected {other}, expected a number, a name or '('"),
            )),
        }
    }

    /// `name(args)`, with the current token at the '('.
    fn call(&mut self, name: &str, col: usize) -> Result<(), ToolError> {
        let Some(func) = Func::by_name(name) else {
            return Err(match name {
                "pi" | "e" => invalid(col, format!("'{name}' is a constant, not a function")),
                _ if KEYWORDS.contains(&name) => unknown_name(name, col),
                _ => not_allowed(col, format!("unknown function '{name}'")),
            });
        };
        let (min, max) = func.arity();
        let arity_error = |got: &str| {
            let expected = if min == max {
                format!("{min} argument")
            } else {
                format!("{min} or {max} arguments")
            };
            invalid(col, format!("{name}() takes {expected}, got {got}"))
        };
        self.enter(col)?;
        self.advance()?;
        let mut argc = 0;
        while self.tok != Tok::RParen {
            if argc == max {
                return Err(arity_error(&format!("more than {max}")));
            }
            self.expr()?;
            argc += 1;
            match self.tok {
                Tok::Comma => self.advance()?,
                Tok::RParen => {}
                other => {
                    return Err(invalid(
                        self.col,
                        format!(
                            "expected ',' or ')' in the call of {name}() from column {col}, found {other}"
                        ),
                    ));
                }
            }
        }
        if argc < min {
            return Err(arity_error(&argc.to_string()));
        }
        self.depth -= 1;
        self.code.push(Op::Call(func, argc, col));
        self.advance()
    }
}

fn unknown_name(name: &str, col: usize) -> ToolError {
    if KEYWORDS.contains(&name) {
        not_allowed(col, format!("keyword '{name}' is not allowed"))
    } else {
        not_allowed(col, format!("unknown name '{name}'"))
    }
}

impl Program {
    /// Runs the code. Every intermediate result is finite or the run fails.
    pub fn eval(&self) -> Result<f64, ToolError> {
        let mut stack: Vec<f64> = Vec::with_capacity(16);
        for op in &self.code {
            match *op {
                Op::Num(v) => stack.push(v),
                Op::HugeLiteral(col) => {
                    return Err(math_error(col, "number too large for a 64-bit float"));
                }
                Op::Neg => {
                    let top = stack.last_mut().ok_or_else(stack_bug)?;
                    *top = -*top;
                }
                Op::Bin(op, col) => {
                    let b = stack.pop().ok_or_else(stack_bug)?;
                    let a = stack.pop().ok_or_else(stack_bug)?;
                    let r = binary(op, a, b, col)?;
                    if !r.is_finite() {
                        return Err(math_error(
                            col,
                            format!("result of '{}' is too large (overflow)", op.symbol()),
                        ));
                    }
                    stack.push(r);
                }
                Op::Call(func, argc, col) => {
                    let base = stack.len().checked_sub(argc).ok_or_else(stack_bug)?;
                    let r = call(func, &stack[base..], col)?;
                    if !r.is_finite() {
                        return Err(math_error(
                            col,
                            format!("result of {}() is too large (overflow)", func.name()),
                        ));
                    }
                    stack.truncate(base);
                    stack.push(r);
                }
            }
        }
        match stack.as_slice() {
            [v] => Ok(*v),
            _ => Err(stack_bug()),
        }
    }
}

fn stack_bug() -> ToolError {
    ToolError::new(ErrorCode::Internal, "calculator: malformed program")
}

fn binary(op: BinOp, a: f64, b: f64, col: usize) -> Result<f64, ToolError> {
    Ok(match op {
        BinOp::Add => a + b,
        BinOp::Sub => a - b,
        BinOp::Mul => a * b,
        BinOp::Div | BinOp::FloorDiv | BinOp::Mod if b == 0.0 => {
            return Err(division_by_zero(col, None));
        }
        BinOp::Div => a / b,
        BinOp::FloorDiv => python_floordiv(a, b),
        BinOp::Mod => python_mod(a, b),
        BinOp::Pow => {
            if a == 0.0 && b < 0.0 {
                return Err(division_by_zero(col, Some("0 raised to a negative power")));
            }
            if a < 0.0 && b.fract() != 0.0 {
                return Err(math_error(
                    col,
                    "negative number raised to a fractional power (the result is complex)",
                ));
            }
            a.powf(b)
        }
    })
}

/// Python's float `%`: the result takes the divisor's sign. `b` is not zero.
fn python_mod(a: f64, b: f64) -> f64 {
    let m = a % b;
    if m == 0.0 {
        0.0_f64.copysign(b)
    } else if (b < 0.0) != (m < 0.0) {
        m + b
    } else {
        m
    }
}

/// Python's float `//` (CPython's float_divmod): floor of the quotient. `b` is not zero.
fn python_floordiv(a: f64, b: f64) -> f64 {
    let m = a % b;
    let mut div = (a - m) / b;
    if m != 0.0 && (b < 0.0) != (m < 0.0) {
        div -= 1.0;
    }
    if div == 0.0 {
        return 0.0_f64.copysign(a / b);
    }
    let floor = div.floor();
    if div - floor > 0.5 {
        floor + 1.0
    } else {
        floor
    }
}

fn call(func: Func, args: &[f64], col: usize) -> Result<f64, ToolError> {
    let x = args.first().copied().ok_or_else(stack_bug)?;
    let second = args.get(1).copied();
    let domain = |what: &str| math_error(col, format!("{what} (math domain error)"));
    Ok(match func {
        Func::Sqrt if x < 0.0 => return Err(domain("sqrt() of a negative number")),
        Func::Sqrt => x.sqrt(),
        Func::Sin => x.sin(),
        Func::Cos => x.cos(),
        Func::Tan => x.tan(),
        Func::Log | Func::Log10 if x <= 0.0 => {
            return Err(domain(&format!("{}() of a number <= 0", func.name())));
        }
        Func::Log => match second {
            None => x.ln(),
            Some(base) if base <= 0.0 => return Err(domain("log() base <= 0")),
            Some(1.0) => {
                return Err(division_by_zero(col, Some("log() base 1")));
            }
            Some(base) => x.ln() / base.ln(),
        },
        Func::Log10 => x.log10(),
        Func::Exp => x.exp(),
        Func::Abs => x.abs(),
        Func::Round => match second {
            None => x.round_ties_even(),
            Some(digits) => {
                if digits.fract() != 0.0 {
                    return Err(invalid(
                        col,
                        format!("round() needs a whole number of digits, got {digits}"),
                    ));
                }
                python_round(x, digits)
            }
        },
    })
}

/// Python's `round(x, digits)` for floats: the exact binary value rounded to `digits`
/// decimal places, ties to even, then read back as the nearest float.
fn python_round(x: f64, digits: f64) -> f64 {
    // CPython's bounds: beyond these the answer is `x` or a signed zero.
    if digits > 323.0 {
        return x;
    }
    if digits < -308.0 {
        return 0.0 * x;
    }
    // In range, so the conversions are exact.
    let digits = digits as i32;
    if digits >= 0 {
        // Rust's fixed-precision formatting rounds the exact value, ties to even.
        let places = digits as usize;
        return format!("{x:.places$}").parse().unwrap_or(x);
    }
    // Round to a multiple of 10^k: split the exact integer digits of |x| at k.
    let k = digits.unsigned_abs() as usize;
    let ax = x.abs();
    let whole = ax.trunc();
    let has_fraction = ax > whole;
    let mut text = format!("{whole:.0}");
    if text.len() < k + 1 {
        text.insert_str(0, &"0".repeat(k + 1 - text.len()));
    }
    let (head, tail) = text.split_at(text.len() - k);
    let half = format!("5{}", "0".repeat(k - 1));
    let up = match tail.cmp(half.as_str()) {
        std::cmp::Ordering::Greater => true,
        std::cmp::Ordering::Less => false,
        std::cmp::Ordering::Equal => {
            has_fraction || head.as_bytes().last().is_some_and(|d| (d - b'0') % 2 == 1)
        }
    };
    let mut head = head.as_bytes().to_vec();
    if up {
        let mut i = head.len();
        loop {
            if i == 0 {
                head.insert(0, b'1');
                break;
            }
            i -= 1;
            if head[i] == b'9' {
                head[i] = b'0';
            } else {
                head[i] += 1;
                break;
            }
        }
    }
    let mut rounded = String::from_utf8(head).unwrap_or_default();
    rounded.push_str(&"0".repeat(k));
    let magnitude: f64 = rounded.parse().unwrap_or(f64::INFINITY);
    magnitude.copysign(x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use crate::config::Config;
    use crate::exec::{CallRequest, Executor};
    use crate::metrics::Metrics;
    use crate::tools::inline_registry;
    use tokio_util::sync::CancellationToken;

    fn ok(expr: &str) -> (f64, String) {
        match evaluate(expr) {
            Ok(v) => (v, format_number(v)),
            Err(e) => panic!("{expr:?} failed: {e}"),
        }
    }

    fn err(expr: &str) -> ToolError {
        match evaluate(expr) {
            Ok(v) => panic!("{expr:?} evaluated to {v}, expected an error"),
            Err(e) => e,
        }
    }

    fn assert_code(expr: &str, code: ErrorCode, prefix: &str) -> ToolError {
        let e = err(expr);
        assert_eq!(e.code, code, "{expr:?}: {e}");
        assert!(e.message.starts_with(prefix), "{expr:?}: {}", e.message);
        e
    }

    fn invalid_expr(expr: &str) -> ToolError {
        assert_code(expr, ErrorCode::InvalidArguments, "Invalid expression")
    }

    fn math(expr: &str) -> ToolError {
        assert_code(expr, ErrorCode::MathError, "Math error: ")
    }

    #[tokio::test]
    async fn seed_test_table() {
        let ctx = CallContext::with_timeout("t", Duration::from_secs(1));
        let run = |expr: &str| {
            Calculator.run(
                CalculatorInput {
                    expression: expr.to_string(),
                },
                &ctx,
            )
        };
        for (expr, value) in [("2 + 2", 4.0), ("sqrt(16)", 4.0), ("sin(0)", 0.0)] {
            let out = run(expr).await.unwrap();
            assert_eq!(out.value, value, "{expr}");
            assert_eq!(out.formatted, format!("{value}"), "{expr}");
        }
        let e = run("1 / 0").await.unwrap_err();
        assert_eq!(e.code, ErrorCode::DivisionByZero);
        assert_eq!(e.message, "Division by zero");
        for expr in ["import os", "__import__('os')"] {
            let e = run(expr).await.unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidArguments, "{expr}");
            assert!(e.message.starts_with("Invalid expression"), "{}", e.message);
        }
        // The seed's examples.
        assert_eq!(run("sin(pi/2)").await.unwrap().formatted, "1");
        assert_eq!(run("2**10").await.unwrap().formatted, "1024");
    }

    /// (expression, value, formatted); the values and strings are what CPython 3 gives for
    /// `float(eval(expr))` and the seed's `_format_result` with floats.
    #[allow(clippy::approx_constant)] // round(pi, 4) is 3.1416
    const PYTHON_TABLE: &[(&str, f64, &str)] = &[
        ("-2**2", -4.0, "-4"),
        ("(-2)**2", 4.0, "4"),
        ("2**-1", 0.5, "0.5"),
        ("2**3**2", 512.0, "512"),
        ("(2**3)**2", 64.0, "64"),
        ("2**-3**2", 0.001953125, "0.001953125"),
        ("-2**-2", -0.25, "-0.25"),
        ("--2", 2.0, "2"),
        ("+-+2", -2.0, "-2"),
        ("2--3", 5.0, "5"),
        ("2*-3", -6.0, "-6"),
        ("1 + 2 * 3", 7.0, "7"),
        ("(1 + 2) * 3", 9.0, "9"),
        ("10 - 4 - 3", 3.0, "3"),
        ("2 ** 2 * 3", 12.0, "12"),
        ("100 / 10 / 5", 2.0, "2"),
        ("7 / 2", 3.5, "3.5"),
        ("7 // 2", 3.0, "3"),
        ("-7 // 2", -4.0, "-4"),
        ("7 // -2", -4.0, "-4"),
        ("-7 // -2", 3.0, "3"),
        ("7.5 // 2", 3.0, "3"),
        ("-7.5 // 2", -4.0, "-4"),
        ("7 % 3", 1.0, "1"),
        ("-7 % 3", 2.0, "2"),
        ("7 % -3", -2.0, "-2"),
        ("-7 % -3", -1.0, "-1"),
        ("5.5 % 2", 1.5, "1.5"),
        ("-5.5 % 2", 0.5, "0.5"),
        ("1 % 0.1", 0.09999999999999995, "0.1"),
        ("2 * 3 % 4", 2.0, "2"),
        ("1.5", 1.5, "1.5"),
        (".5", 0.5, "0.5"),
        ("1.", 1.0, "1"),
        ("1e3", 1000.0, "1000"),
        ("1E3", 1000.0, "1000"),
        ("2.5e-3", 0.0025, "0.0025"),
        ("1e+2", 100.0, "100"),
        ("0", 0.0, "0"),
        ("00", 0.0, "0"),
        ("-0", 0.0, "0"),
        ("pi", std::f64::consts::PI, "3.141592654"),
        ("e", std::f64::consts::E, "2.718281828"),
        ("0.1 + 0.2", 0.30000000000000004, "0.3"),
        ("1 / 3", 0.3333333333333333, "0.3333333333"),
        ("2 / 3", 0.6666666666666666, "0.6666666667"),
        ("2 ** 0.5", std::f64::consts::SQRT_2, "1.414213562"),
        ("sqrt(2)", std::f64::consts::SQRT_2, "1.414213562"),
        ("1e-5", 1e-05, "1e-05"),
        ("0.0001", 0.0001, "0.0001"),
        ("0.00012345", 0.00012345, "0.00012345"),
        ("1 / 7 / 1000000", 1.4285714285714285e-07, "1.428571429e-07"),
        ("12345678901.5", 12345678901.5, "1.23456789e+10"),
        ("1234567890.5", 1234567890.5, "1234567890"),
        ("9999999999.5", 9999999999.5, "1e+10"),
        ("123456.789", 123456.789, "123456.789"),
        (
            "2 ** 100",
            1.2676506002282294e+30,
            "1267650600228229401496703205376",
        ),
        ("1e21", 1e21, "1000000000000000000000"),
        ("1e22", 1e22, "10000000000000000000000"),
        ("10 ** 15 + 0.5", 1000000000000000.5, "1e+15"),
        ("2.0 ** 53 + 1", 9007199254740992.0, "9007199254740992"),
        ("sin(pi)", 1.2246467991473532e-16, "1.224646799e-16"),
        ("cos(pi)", -1.0, "-1"),
        ("tan(pi / 4)", 0.9999999999999999, "1"),
        ("log(e)", 1.0, "1"),
        ("log(8, 2)", 3.0, "3"),
        ("log(1000, 10)", 2.9999999999999996, "3"),
        ("log(0.5, 0.25)", 0.5, "0.5"),
        ("log10(1000)", 3.0, "3"),
        ("exp(1)", std::f64::consts::E, "2.718281828"),
        ("exp(-1000)", 0.0, "0"),
        ("abs(-3.5)", 3.5, "3.5"),
        ("abs(-2) ** 2", 4.0, "4"),
        ("round(2.5)", 2.0, "2"),
        ("round(3.5)", 4.0, "4"),
        ("round(-2.5)", -2.0, "-2"),
        ("round(0.5)", 0.0, "0"),
        ("round(2.675, 2)", 2.67, "2.67"),
        ("round(0.125, 2)", 0.12, "0.12"),
        ("round(0.375, 2)", 0.38, "0.38"),
        ("round(1.23456, 3)", 1.235, "1.235"),
        ("round(1234.5, -2)", 1200.0, "1200"),
        ("round(1250, -2)", 1200.0, "1200"),
        ("round(1350, -2)", 1400.0, "1400"),
        ("round(1250.5, -2)", 1300.0, "1300"),
        ("round(-1250, -2)", -1200.0, "-1200"),
        ("round(45, -1)", 40.0, "40"),
        ("round(55, -1)", 60.0, "60"),
        ("round(99, -1)", 100.0, "100"),
        ("round(5, -1)", 0.0, "0"),
        ("round(15, -1)", 20.0, "20"),
        ("round(4, -1)", 0.0, "0"),
        ("round(123.456, 400)", 123.456, "123.456"),
        ("round(123.456, -400)", 0.0, "0"),
        ("round(pi, 4)", 3.1416, "3.1416"),
        ("sqrt(16,)", 4.0, "4"),
        (" \t2\n+\r2 ", 4.0, "4"),
        ("(((((1)))))", 1.0, "1"),
        (
            "2 ** 1023 * 1.5",
            1.348269851146737e+308,
            "134826985114673693079697889309176855021348273420672992955072560868299506854125722349531357991805652015840085409903545018244092326610812466869635572979605593283325920068649113957226664700934570589589812214063754326628613011756847161105434832905620427872512883013439723679960434453859787228626517247218168102912",
        ),
    ];

    #[test]
    fn python_semantics() {
        for &(expr, value, formatted) in PYTHON_TABLE {
            let (v, f) = ok(expr);
            assert_eq!(v, value, "{expr:?}");
            assert_eq!(f, formatted, "{expr:?}");
        }
        // A complex result in Python.
        math("(-8) ** (1/3)");
    }

    #[test]
    fn division_by_zero_is_typed() {
        for expr in [
            "1 / 0",
            "1 // 0",
            "1 % 0",
            "5 % (2 - 2)",
            "1 / 0.0",
            "0 / 0",
            "-1 // -0.0",
        ] {
            let e = assert_code(expr, ErrorCode::DivisionByZero, "Division by zero");
            assert_eq!(e.message, "Division by zero", "{expr}");
        }
        assert_code("0 ** -1", ErrorCode::DivisionByZero, "Division by zero");
        assert_code("log(5, 1)", ErrorCode::DivisionByZero, "Division by zero");
        // Syntax is checked before anything runs.
        invalid_expr("1 / 0 +");
    }

    #[test]
    fn domain_and_range_errors_are_math_errors() {
        for expr in [
            "sqrt(-1)",
            "log(0)",
            "log(-1)",
            "log10(0)",
            "log(2, 0)",
            "log(2, -2)",
            "exp(1000)",
            "10 ** 400",
            "2 ** 1024",
            "1e308 * 10",
            "-1e308 * 10",
            "1e308 + 1e308",
            "9**9**9",
            "(-9)**9**9",
            "1e308 / 1e-308",
            "1e308 // 1e-308",
            "round(1.7e308, -308)",
            "(-1) ** 0.5",
            "1e309",
            "1e999 - 1e999",
            "2**1023*2 - 2**1023*2",
        ] {
            math(expr);
        }
        let e = math("sqrt(-1)");
        assert!(e.message.contains("column 1"), "{}", e.message);
        let e = math("1 + 1e308 * 10");
        assert!(
            e.message.contains("'*'") && e.message.contains("column 11"),
            "{}",
            e.message
        );
    }

    #[test]
    fn syntax_errors_say_what_and_where() {
        let cases: &[(&str, &str)] = &[
            ("", "empty"),
            ("   ", "empty"),
            ("2 +", "column 4"),
            ("2 3", "column 3"),
            ("(2", "expected ')'"),
            ("2)", "unmatched ')'"),
            ("1, 2", "','"),
            ("x", "unknown name 'x' at column 1"),
            ("2 * y + 1", "unknown name 'y' at column 5"),
            ("import os", "keyword 'import'"),
            (
                "__import__('os')",
                "unknown function '__import__' at column 1",
            ),
            ("'a'", "strings"),
            ("\"a\" * 3", "strings"),
            ("(1).real", "attribute access"),
            ("os.system('id')", "unknown name 'os' at column 1"),
            ("pi.real", "attribute access"),
            ("x = 1", "unknown name 'x'"),
            ("1 = 1", "assignment"),
            ("1 == 1", "comparisons"),
            ("1 < 2", "comparisons"),
            ("[1, 2]", "lists"),
            ("{}", "dicts"),
            ("1 & 1", "operator '&'"),
            ("~1", "operator '~'"),
            ("1; 2", "single expression"),
            ("2 ! 3", "comparisons"),
            ("sqrt", "'sqrt' is a function"),
            ("pi(2)", "'pi' is a constant"),
            ("sqrt()", "sqrt() takes 1 argument, got 0"),
            ("sqrt(1, 2)", "sqrt() takes 1 argument, got more"),
            ("log(1, 2, 3)", "log() takes 1 or 2 arguments, got more"),
            ("round()", "round() takes 1 or 2 arguments"),
            ("sqrt(4 4)", "expected ',' or ')'"),
            ("sqrt(,)", "unexpected ','"),
            ("2(3)", "unexpected '('"),
            ("(2)(3)", "unexpected '('"),
            ("2pi", "invalid number literal"),
            ("0x10", "invalid number literal"),
            ("1_000", "invalid number literal"),
            ("1.2.3", "invalid number literal"),
            ("1e", "exponent"),
            ("1e+", "exponent"),
            ("012", "leading zeros"),
            ("1j", "invalid number literal"),
            ("2 ** * 3", "unexpected '*'"),
            ("*2", "unexpected '*'"),
            ("2 //", "end of the expression"),
            ("lambda: 0", "keyword 'lambda'"),
            ("True", "keyword 'True'"),
            ("None", "keyword 'None'"),
            ("2 if 1 else 3", "unexpected name 'if'"),
            ("é", "unexpected character 'é'"),
            ("2 × 3", "unexpected character '×' at column 3"),
            ("round(2.5, 0.5)", "whole number of digits"),
        ];
        for &(expr, needle) in cases {
            let e = invalid_expr(expr);
            assert!(
                e.message.contains(needle),
                "{expr:?}: {:?} lacks {needle:?}",
                e.message
            );
        }
    }

    /// SECURITY-CASES.md case 37: calculator abuse.
    #[test]
    fn security_case_37() {
        // `9**9**9`: an overflow, not a hang or a huge integer.
        let start = Instant::now();
        math("9**9**9");
        math("9**9**9**9**9**9**9**9");
        math("2**2**2**2**2**2**2**2**2**2");
        assert!(start.elapsed() < Duration::from_secs(1));

        // 10,000-deep parentheses: rejected by length through the tool, and by the nesting
        // bound in the parser itself, without recursing that deep.
        let deep = format!("{}1{}", "(".repeat(10_000), ")".repeat(10_000));
        invalid_expr(&deep);
        let e = parse(&deep).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArguments);
        assert!(e.message.contains("deeper than 64"), "{}", e.message);
        let unclosed = "(".repeat(10_000);
        assert!(
            parse(&unclosed)
                .unwrap_err()
                .message
                .contains("deeper than 64")
        );
        let calls = format!("{}1{}", "sqrt(".repeat(10_000), ")".repeat(10_000));
        assert!(
            parse(&calls)
                .unwrap_err()
                .message
                .contains("deeper than 64")
        );
        // Exactly at the bound is fine, one more is not (and fits in 1000 characters).
        let at = format!("{}1{}", "(".repeat(MAX_DEPTH), ")".repeat(MAX_DEPTH));
        assert_eq!(ok(&at).0, 1.0);
        let over = format!(
            "{}1{}",
            "(".repeat(MAX_DEPTH + 1),
            ")".repeat(MAX_DEPTH + 1)
        );
        assert!(
            invalid_expr(&over)
                .message
                .contains("deeper than 64 levels at column 65")
        );
        let mixed = format!(
            "{}1{}",
            "abs((".repeat(MAX_DEPTH / 2 + 1),
            "))".repeat(MAX_DEPTH / 2 + 1)
        );
        assert!(invalid_expr(&mixed).message.contains("deeper than 64"));

        // A 1 MiB expression: rejected promptly, whatever it contains.
        let start = Instant::now();
        let mib = "1+".repeat(512 * 1024);
        let e = invalid_expr(&mib);
        assert!(
            e.message.contains("longer than 1000 characters"),
            "{}",
            e.message
        );
        invalid_expr(&"9".repeat(1 << 20));
        invalid_expr(&"é".repeat(1 << 19));
        // The parser alone is linear in the input and recursion-free on long chains.
        let long_sum = format!("{}1", "1+".repeat(512 * 1024));
        assert_eq!(parse(&long_sum).unwrap().eval().unwrap(), 524_289.0);
        let long_power = format!("{}1", "1**".repeat(300_000));
        assert_eq!(parse(&long_power).unwrap().eval().unwrap(), 1.0);
        let long_signs = format!("{}1", "-".repeat(1 << 20));
        assert_eq!(parse(&long_signs).unwrap().eval().unwrap(), 1.0);
        assert!(start.elapsed() < Duration::from_secs(5));
        // ... while 1000 characters are accepted.
        let max = format!("{}1", "1+".repeat(499)) + " ";
        assert_eq!(max.chars().count(), 1000);
        assert_eq!(ok(&max).0, 500.0);
        let over = format!("{max}1");
        assert!(invalid_expr(&over).message.contains("longer than 1000"));
        // Characters, not bytes: 1000 two-byte characters are within the limit.
        let wide = "é".repeat(1000);
        assert!(invalid_expr(&wide).message.contains("unexpected character"));

        // NaN and infinity: no names for them, no way to compute them.
        for expr in [
            "nan",
            "inf",
            "NaN",
            "Infinity",
            "float('nan')",
            "float('inf')",
        ] {
            invalid_expr(expr);
        }
        for expr in [
            "1e309",
            "-1e309",
            "1e308 * 10",
            "1e308 * 10 - 1e308 * 10",
            "0 * 1e999",
            "exp(710)",
            "exp(exp(10))",
            "(1e308 * 10) * 0",
        ] {
            math(expr);
        }

        // __import__, attribute access, names outside the allowed list.
        for expr in [
            "__import__('os')",
            "__import__('os').system('id')",
            "__builtins__",
            "().__class__.__bases__[0].__subclasses__()",
            "(1).__class__",
            "pi.__class__",
            "e.real",
            "sqrt.__globals__",
            "math.sqrt(4)",
            "os",
            "open('/etc/passwd')",
            "eval('1')",
            "exec('1')",
            "globals()",
            "getattr(1, 'real')",
            "import os",
            "from os import system",
            "x",
            "tau",
            "factorial(5)",
            "pow(2, 3)",
            "[x for x in range(9)]",
            "(lambda: 1)()",
            "f'{1}'",
            "b'1'",
            "1 if True else 2",
            "a := 1",
        ] {
            invalid_expr(expr);
        }
    }

    /// The tool itself, bypassing the schema: hostile inputs are rejected promptly.
    #[tokio::test]
    async fn tool_direct_rejects_hostile_inputs() {
        let ctx = CallContext::with_timeout("t", Duration::from_secs(1));
        let start = Instant::now();
        for expression in [
            "(".repeat(10_000) + "1" + &")".repeat(10_000),
            "1+".repeat(512 * 1024),
            "9**9**9".to_string(),
        ] {
            let e = Calculator
                .run(CalculatorInput { expression }, &ctx)
                .await
                .unwrap_err();
            assert!(
                matches!(e.code, ErrorCode::InvalidArguments | ErrorCode::MathError),
                "{e}"
            );
        }
        assert!(start.elapsed() < Duration::from_secs(1));
    }

    fn executor() -> Executor {
        let registry = inline_registry(&Config::default()).unwrap();
        Executor::new(Arc::new(registry), Arc::new(Metrics::new()))
    }

    async fn call(exec: &Executor, arguments_json: &str) -> crate::exec::CallOutcome {
        exec.call(
            CallRequest {
                tool: "calculator".into(),
                arguments_json: arguments_json.into(),
                ..Default::default()
            },
            None,
            CancellationToken::new(),
        )
        .await
    }

    #[tokio::test]
    async fn through_the_executor() {
        let exec = executor();
        let entry = exec.registry().get("calculator").unwrap().clone();
        assert_eq!(entry.timeout, Duration::from_millis(1000));
        let out = call(&exec, r#"{"expression": "2 + 2"}"#).await;
        assert!(out.ok(), "{:?}", out.error);
        assert_eq!(
            out.output_json.as_deref(),
            Some(r#"{"formatted":"4","value":4}"#)
        );
        assert_eq!(out.output_hash.len(), 64);

        let out = call(&exec, r#"{"expression": "1/0"}"#).await;
        assert_eq!(out.error.unwrap().code, ErrorCode::DivisionByZero);
        let out = call(&exec, r#"{"expression": "sqrt(-1)"}"#).await;
        assert_eq!(out.error.unwrap().code, ErrorCode::MathError);
        let out = call(&exec, r#"{"expression": "__import__('os')"}"#).await;
        let e = out.error.unwrap();
        assert_eq!(e.code, ErrorCode::InvalidArguments);
        assert!(e.message.starts_with("Invalid expression"));
    }

    #[tokio::test]
    async fn schema_rejects_long_expressions_with_the_path() {
        let exec = executor();
        let exactly = format!("{}1", "1+".repeat(499)) + " ";
        let args = serde_json::json!({ "expression": exactly }).to_string();
        assert!(call(&exec, &args).await.ok());

        let long = format!("{exactly}1");
        assert_eq!(long.chars().count(), 1001);
        let args = serde_json::json!({ "expression": long }).to_string();
        let e = call(&exec, &args).await.error.unwrap();
        assert_eq!(e.code, ErrorCode::InvalidArguments);
        assert!(e.message.contains("/expression"), "{}", e.message);
        assert!(e.message.contains("input schema"), "{}", e.message);
        let details = e.details.unwrap();
        assert_eq!(details["errors"][0]["path"], "/expression");

        // A 1 MiB expression stops at the schema as well.
        let args = serde_json::json!({ "expression": "(".repeat(1 << 20) }).to_string();
        let e = call(&exec, &args).await.error.unwrap();
        assert_eq!(e.code, ErrorCode::InvalidArguments);
        assert!(e.message.contains("/expression"), "{}", e.message);
    }

    #[tokio::test]
    async fn malformed_arguments_are_invalid_arguments() {
        let exec = executor();
        for args in [
            "2 + 2",
            "not json",
            r#"{"expression": "2+2""#,
            "[]",
            r#"["2 + 2"]"#,
            r#""2 + 2""#,
            "42",
            "null",
            "{}",
            r#"{"expression": 4}"#,
            r#"{"expression": null}"#,
            r#"{"expression": "2+2", "extra": 1}"#,
            r#"{"expr": "2+2"}"#,
        ] {
            let out = call(&exec, args).await;
            let e = out.error.unwrap_or_else(|| panic!("{args:?} succeeded"));
            assert_eq!(e.code, ErrorCode::InvalidArguments, "{args:?}: {e}");
            assert!(out.output_json.is_none());
        }
    }

    #[test]
    fn schemas() {
        let input = crate::tool::schema_of::<CalculatorInput>();
        let expression = &input["properties"]["expression"];
        assert_eq!(expression["type"], "string");
        assert_eq!(expression["maxLength"], 1000);
        assert_eq!(input["additionalProperties"], false);
        assert_eq!(input["required"], serde_json::json!(["expression"]));
        let output = crate::tool::schema_of::<CalculatorOutput>();
        assert_eq!(output["properties"]["value"]["type"], "number");
        assert_eq!(output["properties"]["formatted"]["type"], "string");
        let meta = Calculator.metadata();
        assert_eq!(meta.id, "calculator");
        assert_eq!(meta.category, Category::Computation);
        assert!(!meta.sandbox_required);
    }

    #[test]
    fn formatting() {
        for (v, s) in [
            (4.0, "4"),
            (-0.0, "0"),
            (0.5, "0.5"),
            (-1.5, "-1.5"),
            (1e21, "1000000000000000000000"),
            (1e30, "1000000000000000019884624838656"),
            (-1e21, "-1000000000000000000000"),
            (123456789012.0, "123456789012"),
            (0.1, "0.1"),
            (1.0 / 3.0, "0.3333333333"),
            (0.000123456789012, "0.000123456789"),
            (0.0000123456789012, "1.23456789e-05"),
            (1e-300, "1e-300"),
            (5e-324, "4.940656458e-324"),
            (99999.999999999, "100000"),
            (0.99999999999, "1"),
            (123456789.25, "123456789.2"),
            (123456789.35, "123456789.3"),
        ] {
            assert_eq!(format_number(v), s, "{v:e}");
        }
    }
}

//! A template's syntax tree held to the subset (see the module's documentation): what it
//! may not do is refused before it runs, each refusal at its line and column; the files it
//! names by a constant are collected, so a class naming a file it does not have is refused
//! as the class is checked.

use minijinja::machinery::ast::{BinOpKind, CallArg, Expr, Stmt};
use minijinja::machinery::{Span, parse};

/// The functions a template may call; each takes one file of the class.
pub const FUNCTIONS: [&str; 3] = ["text", "json", "base64"];

/// The filters a template may use.
pub const FILTERS: [&str; 13] = [
    "lower",
    "upper",
    "trim",
    "default",
    "b64encode",
    "b64decode",
    "urlencode",
    "tojson",
    "join",
    "length",
    "first",
    "last",
    "items",
];

/// The tests a template may use (`x is defined`).
pub const TESTS: [&str; 7] = [
    "defined",
    "undefined",
    "none",
    "string",
    "number",
    "mapping",
    "sequence",
];

/// What checking a template found: the files it names (with where), or its problems.
#[derive(Debug, Default)]
pub(crate) struct Checked {
    /// How deep the walk is now (bounded: the tokens were, and so is the walk).
    depth: usize,
    /// `(file, line, column)` of every `text("…")`, `json("…")`, `base64("…")`.
    pub(crate) files: Vec<(String, usize, usize)>,
    /// `line L, column C: …`, at most a few.
    pub(crate) problems: Vec<String>,
}

/// The deepest the checker's walk goes: the tokens were bounded to [`super::MAX_NESTING`]
/// (each level of the tree is at least one token's), so this is a second guard only.
const WALK_DEPTH: usize = 2 * super::MAX_NESTING + 8;

/// The most problems one template reports.
const MAX_PROBLEMS: usize = 8;

/// Parses `source` and walks it: every construct outside the subset is a problem.
pub(crate) fn check(source: &str) -> Checked {
    let mut checked = Checked::default();
    // Bounded on the tokens before any recursive parse or walk (see `nesting`).
    if let Some(span) = super::nesting::too_deep(source) {
        checked.refuse(
            span,
            &format!(
                "it nests deeper than {} levels (operators, brackets and blocks); split it \
                 or flatten it",
                super::MAX_NESTING
            ),
        );
        return checked;
    }
    match parse(source, "template", Default::default()) {
        Ok(tree) => checked.stmt(&tree),
        Err(err) => {
            let at = match (err.line(), err.range()) {
                (Some(line), Some(range)) => {
                    format!("line {line}, column {}", column(source, range.start))
                }
                (Some(line), None) => format!("line {line}"),
                _ => "the template".to_owned(),
            };
            let what = err
                .detail()
                .map(|d| bounded::quote(d).to_string())
                .unwrap_or_else(|| err.kind().to_string());
            checked
                .problems
                .push(format!("{at}: not a template: {}", strip_quotes(&what)));
        }
    }
    checked
}

/// The column (1-based, in characters) of byte `offset` of `source`.
fn column(source: &str, offset: usize) -> usize {
    let before = &source[..offset.min(source.len())];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    before[line_start..].chars().count() + 1
}

fn strip_quotes(quoted: &str) -> &str {
    quoted
        .strip_prefix('"')
        .and_then(|q| q.strip_suffix('"'))
        .unwrap_or(quoted)
}

/// Where a statement is.
fn span_of_stmt(stmt: &Stmt<'_>) -> Span {
    match stmt {
        Stmt::Template(s) => s.span(),
        Stmt::EmitExpr(s) => s.span(),
        Stmt::EmitRaw(s) => s.span(),
        Stmt::ForLoop(s) => s.span(),
        Stmt::IfCond(s) => s.span(),
        Stmt::WithBlock(s) => s.span(),
        Stmt::Set(s) => s.span(),
        Stmt::SetBlock(s) => s.span(),
        Stmt::AutoEscape(s) => s.span(),
        Stmt::FilterBlock(s) => s.span(),
        Stmt::Do(s) => s.span(),
    }
}

impl Checked {
    fn refuse(&mut self, span: Span, what: &str) {
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(format!(
                "line {}, column {}: {what}",
                span.start_line,
                span.start_col + 1
            ));
        }
    }

    fn stmts(&mut self, stmts: &[Stmt<'_>]) {
        for stmt in stmts {
            self.stmt(stmt);
        }
    }

    /// Runs `walk` one level deeper, unless that passes the bound (reported once).
    fn deeper(&mut self, span: Span, walk: impl FnOnce(&mut Self)) {
        if self.depth >= WALK_DEPTH {
            if !self.problems.iter().any(|p| p.contains("nests deeper")) {
                self.refuse(span, "it nests deeper than a template may");
            }
            return;
        }
        self.depth += 1;
        walk(self);
        self.depth -= 1;
    }

    fn stmt(&mut self, stmt: &Stmt<'_>) {
        self.deeper(span_of_stmt(stmt), |this| this.stmt_within(stmt));
    }

    fn stmt_within(&mut self, stmt: &Stmt<'_>) {
        match stmt {
            Stmt::Template(t) => self.stmts(&t.children),
            Stmt::EmitRaw(_) => {}
            Stmt::EmitExpr(e) => self.expr(&e.expr),
            Stmt::IfCond(c) => {
                self.expr(&c.expr);
                self.stmts(&c.true_body);
                self.stmts(&c.false_body);
            }
            Stmt::ForLoop(f) => {
                if f.recursive {
                    self.refuse(f.span(), "a recursive loop is not allowed");
                }
                self.expr(&f.target);
                self.expr(&f.iter);
                if let Some(filter) = &f.filter_expr {
                    self.expr(filter);
                }
                self.stmts(&f.body);
                self.stmts(&f.else_body);
            }
            Stmt::Set(s) => self.refuse(s.span(), "`set` is not allowed (no assignment)"),
            Stmt::SetBlock(s) => self.refuse(s.span(), "`set` is not allowed (no assignment)"),
            Stmt::WithBlock(s) => self.refuse(s.span(), "`with` is not allowed"),
            Stmt::FilterBlock(s) => self.refuse(s.span(), "a `filter` block is not allowed"),
            Stmt::AutoEscape(s) => self.refuse(s.span(), "`autoescape` is not allowed"),
            Stmt::Do(s) => self.refuse(s.span(), "`do` is not allowed"),
        }
    }

    fn args(&mut self, args: &[CallArg<'_>]) {
        for arg in args {
            match arg {
                CallArg::Pos(e) | CallArg::Kwarg(_, e) => self.expr(e),
                CallArg::PosSplat(e) | CallArg::KwargSplat(e) => self.expr(e),
            }
        }
    }

    fn expr(&mut self, expr: &Expr<'_>) {
        self.deeper(expr.span(), |this| this.expr_within(expr));
    }

    fn expr_within(&mut self, expr: &Expr<'_>) {
        match expr {
            Expr::Var(_) | Expr::Const(_) => {}
            Expr::UnaryOp(u) => self.expr(&u.expr),
            Expr::BinOp(b) => match b.op {
                BinOpKind::ScAnd
                | BinOpKind::ScOr
                | BinOpKind::In
                | BinOpKind::Eq
                | BinOpKind::Ne
                | BinOpKind::Lt
                | BinOpKind::Lte
                | BinOpKind::Gt
                | BinOpKind::Gte => {
                    self.expr(&b.left);
                    self.expr(&b.right);
                }
                _ => self.refuse(
                    b.span(),
                    "arithmetic and `~` are not allowed (a template only reads its inputs)",
                ),
            },
            Expr::Compare(c) => {
                self.expr(&c.expr);
                for op in &c.ops {
                    self.expr(&op.expr);
                }
            }
            Expr::IfExpr(i) => {
                self.expr(&i.test_expr);
                self.expr(&i.true_expr);
                if let Some(e) = &i.false_expr {
                    self.expr(e);
                }
            }
            Expr::Filter(f) => {
                if !FILTERS.contains(&f.name) {
                    self.refuse(
                        f.span(),
                        &format!(
                            "no filter {} (filters: {})",
                            bounded::quote(f.name),
                            FILTERS.join(", ")
                        ),
                    );
                }
                if let Some(e) = &f.expr {
                    self.expr(e);
                }
                self.args(&f.args);
            }
            Expr::Test(t) => {
                if !TESTS.contains(&t.name) {
                    self.refuse(
                        t.span(),
                        &format!(
                            "no test {} (tests: {})",
                            bounded::quote(t.name),
                            TESTS.join(", ")
                        ),
                    );
                }
                self.expr(&t.expr);
                self.args(&t.args);
            }
            Expr::GetAttr(g) => self.expr(&g.expr),
            Expr::GetItem(g) => {
                self.expr(&g.expr);
                self.expr(&g.subscript_expr);
            }
            Expr::Call(c) => self.call(c.span(), &c.expr, &c.args),
            Expr::List(l) => l.items.iter().for_each(|e| self.expr(e)),
            Expr::Tuple(t) => t.items.iter().for_each(|e| self.expr(e)),
            Expr::Map(m) => {
                m.keys.iter().for_each(|e| self.expr(e));
                m.values.iter().for_each(|e| self.expr(e));
            }
            Expr::Slice(s) => self.refuse(s.span(), "slices are not allowed"),
        }
    }

    /// A call of one of [`FUNCTIONS`] with one constant file name.
    fn call(&mut self, span: Span, callee: &Expr<'_>, args: &[CallArg<'_>]) {
        let name = match callee {
            Expr::Var(v) if FUNCTIONS.contains(&v.id) => v.id,
            _ => {
                self.refuse(
                    span,
                    &format!(
                        "only {} may be called, each with a file of the class",
                        FUNCTIONS.join(", ")
                    ),
                );
                return;
            }
        };
        match args {
            [CallArg::Pos(Expr::Const(c))] => match c.value.as_str() {
                Some(file) => self.files.push((
                    file.to_owned(),
                    usize::from(span.start_line),
                    usize::from(span.start_col) + 1,
                )),
                None => self.refuse(span, &format!("{name}() takes a file name, a string")),
            },
            _ => self.refuse(
                span,
                &format!("{name}() takes one constant file name, e.g. {name}(\"db/password\")"),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_subset_is_checked_on_the_syntax_tree_with_positions() {
        let ok = check(
            "url={{ json(\"db.json\").host }}:{{ json(\"db.json\")[\"port\"] }}\n\
             {% for k, v in json(\"env.json\") | items %}{{ k | upper }}={{ v }}\n{% endfor %}\
             {% if text(\"flag\") == \"on\" and not false %}on{% endif %}{{ text(\"pw\") | b64encode }}",
        );
        assert!(ok.problems.is_empty(), "{:?}", ok.problems);
        let files: Vec<&str> = ok.files.iter().map(|(f, _, _)| f.as_str()).collect();
        assert_eq!(files, ["db.json", "db.json", "env.json", "flag", "pw"]);
        for (source, fragment) in [
            ("{% set a = 1 %}", "line 1, column 4: `set` is not allowed"),
            (
                "x\n{{ text(\"a\") ~ text(\"a\") }}",
                "line 2, column 4: arithmetic and `~`",
            ),
            ("{{ 1 + 2 }}", "arithmetic"),
            ("{{ \"x\" * 1000000 }}", "arithmetic"),
            (
                "{{ text(\"a\") | replace(\"a\", \"bb\") }}",
                "no filter \"replace\"",
            ),
            ("{{ range(10) }}", "only text, json, base64 may be called"),
            ("{{ text(name) }}", "text() takes one constant file name"),
            (
                "{% for x in y recursive %}{{ loop(x) }}{% endfor %}",
                "a recursive loop",
            ),
            ("{% macro m() %}{% endmacro %}", "not a template"),
            ("{% include \"other\" %}", "not a template"),
            ("{{ text(\"a\")[1:] }}", "slices are not allowed"),
            ("{{ x is divisibleby(3) }}", "no test \"divisibleby\""),
            ("{{ unclosed", "line 1"),
        ] {
            let checked = check(source);
            assert!(
                checked.problems.iter().any(|p| p.contains(fragment)),
                "{source:?}: {:?}",
                checked.problems
            );
        }
    }
}

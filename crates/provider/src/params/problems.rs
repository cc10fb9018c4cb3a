//! What is wrong with a SecretProviderClass: every problem, in order, each naming its
//! parameter or entry field, with the values a tenant wrote quoted (escaped, cut).
//!
//! A leaf module: the checks of every other module here report through it.

use std::fmt;

use csi_grpc::MountError;

/// The Go provider's prefixes, kept so messages read the same to existing users.
pub(crate) const HANDLE_PREFIX: &str = "unable to handle SecretProviderClass secrets";
pub(crate) const UNMARSHAL_PREFIX: &str = "unable to handle SecretProviderClass secrets: failed to unmarshal SecretProviderClass parameter \"secrets\"";
pub(crate) const RETRIEVE_PREFIX: &str = "unable to retrieve secrets";

/// The most problems of one class kept (`check` lists them; past it, their count).
pub const MAX_PROBLEMS: usize = 64;

/// The most problems a Mount's message lists; the rest are counted (`check` lists all).
const PROBLEMS_IN_A_MESSAGE: usize = 8;

/// The parameters the driver sent cannot be used. Always `InvalidArgument`: retrying the
/// same SecretProviderClass cannot succeed. It holds every problem found (checks go on past
/// the first), each naming the parameter, the entry and the value; parameters hold names
/// and OCIDs, never secret material.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamError {
    problems: Vec<String>,
    /// Problems found past [`MAX_PROBLEMS`].
    more: usize,
}

impl ParamError {
    /// One problem.
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self {
            problems: vec![message.into()],
            more: 0,
        }
    }

    /// The problems, in the order of the class's parameters and entries (at most
    /// [`MAX_PROBLEMS`]).
    pub fn problems(&self) -> &[String] {
        &self.problems
    }

    /// How many problems were found, listed or not.
    pub fn count(&self) -> usize {
        self.problems.len() + self.more
    }

    /// The first problem.
    pub fn first(&self) -> &str {
        self.problems.first().map_or("", String::as_str)
    }

    /// The same problems, each message passed through `f`.
    pub(crate) fn map(self, f: impl Fn(&str) -> String) -> Self {
        Self {
            problems: self.problems.iter().map(|p| f(p)).collect(),
            more: self.more,
        }
    }
}

impl fmt::Display for ParamError {
    /// One problem reads as it always did; several are numbered on one line (pod events
    /// show one), the first `PROBLEMS_IN_A_MESSAGE` of them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.count() == 1 {
            return f.write_str(self.first());
        }
        write!(f, "the SecretProviderClass has {} problems:", self.count())?;
        for (i, problem) in self.problems.iter().take(PROBLEMS_IN_A_MESSAGE).enumerate() {
            let sep = if i == 0 { "" } else { ";" };
            write!(f, "{sep} ({}) {problem}", i + 1)?;
        }
        let rest = self.count().saturating_sub(PROBLEMS_IN_A_MESSAGE);
        if rest > 0 {
            write!(
                f,
                "; and {rest} more (the provider's `check` command lists every one)"
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for ParamError {}

impl From<ParamError> for MountError {
    fn from(err: ParamError) -> Self {
        MountError::invalid_argument(err.to_string())
    }
}

/// The problems of one class as they are found.
#[derive(Debug, Default)]
pub(crate) struct Problems {
    found: Option<ParamError>,
}

impl Problems {
    /// The value, or `None` with its problems noted.
    pub(crate) fn take<T>(&mut self, checked: Result<T, ParamError>) -> Option<T> {
        match checked {
            Ok(value) => Some(value),
            Err(err) => {
                self.note(err);
                None
            }
        }
    }

    /// Notes the problems of `err`.
    pub(crate) fn note(&mut self, err: ParamError) {
        let found = self.found.get_or_insert_with(|| ParamError {
            problems: Vec::new(),
            more: 0,
        });
        for problem in err.problems {
            if found.problems.len() < MAX_PROBLEMS {
                found.problems.push(problem);
            } else {
                found.more += 1;
            }
        }
        found.more += err.more;
    }

    /// `Err` with every problem noted, if any.
    pub(crate) fn finish(self) -> Result<(), ParamError> {
        match self.found {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }
}

/// The name among `known` nearest to `word` when it is close enough to be a slip (a case
/// difference, or at most one edit per three characters): `vaultid` → `vaultId`,
/// `encodng` → `encoding`. It runs for attributes of every mount, so a name whose length
/// alone rules it out (the distance is at least the difference of the lengths) costs no
/// table, and nothing is allocated for the case.
pub(crate) fn nearest<'a>(word: &str, known: &[&'a str]) -> Option<&'a str> {
    let len = word.chars().count();
    known
        .iter()
        .filter_map(|k| {
            let allowed = (k.len() / 3).max(1);
            if len.abs_diff(k.chars().count()) > allowed {
                return None;
            }
            let d = edits(word, k);
            (d <= allowed).then_some((d, *k))
        })
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance (insertions, deletions, substitutions), by characters, ignoring
/// ASCII case; words past 64 characters are no slip of any name here.
fn edits(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    if a.len() > 64 || b.len() > 64 {
        return usize::MAX;
    }
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            let differ = !ca.eq_ignore_ascii_case(cb);
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(differ));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_problem_reads_as_itself_and_many_are_numbered_and_bounded() {
        let mut problems = Problems::default();
        assert!(problems.take(Ok::<_, ParamError>(1)).is_some());
        problems.note(ParamError::new("a is wrong"));
        let one = Problems {
            found: problems.found.clone(),
        };
        assert_eq!(one.finish().unwrap_err().to_string(), "a is wrong");
        for i in 0..100 {
            problems.note(ParamError::new(format!("p{i}")));
        }
        let err = problems.finish().unwrap_err();
        assert_eq!(err.count(), 101);
        assert_eq!(err.problems().len(), MAX_PROBLEMS);
        let shown = err.to_string();
        assert!(
            shown.starts_with("the SecretProviderClass has 101 problems: (1) a is wrong; (2) p0;"),
            "{shown}"
        );
        assert!(shown.ends_with("; and 93 more (the provider's `check` command lists every one)"));
        assert!(!shown.contains("(9)"), "{shown}");
    }

    #[test]
    fn a_slip_of_a_name_finds_the_name_and_anything_else_finds_none() {
        let known = [
            "vaultId",
            "region",
            "encoding",
            "failoverRegion",
            "authType",
        ];
        assert_eq!(nearest("vaultid", &known), Some("vaultId"));
        assert_eq!(nearest("regoin", &known), Some("region"));
        assert_eq!(nearest("encodng", &known), Some("encoding"));
        assert_eq!(nearest("failoverregion", &known), Some("failoverRegion"));
        assert_eq!(nearest("authtype", &known), Some("authType"));
        assert_eq!(nearest("csi.storage.k8s.io/pod.name", &known), None);
        assert_eq!(nearest("color", &known), None);
        assert_eq!(nearest(&"x".repeat(10_000), &known), None);
    }
}

//! The command-line reader `ember` and the `jailer` share. Each program names its flags in a
//! [`Spec`]; [`Reader`] yields them in order as [`Flag`]s, spelled `--name VALUE` or
//! `--name=VALUE` (switches take no value), and refuses an unknown flag, a missing or an
//! unexpected value, and a second use of a flag that is not repeatable. What a value means
//! is the program's business.

/// The flags a program knows.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// The program's name, for the "see PROGRAM --help" hint.
    pub program: &'static str,
    /// Flags followed by a value.
    pub with_value: &'static [&'static str],
    /// Flags without a value.
    pub switches: &'static [&'static str],
    /// Flags with a value that may be given more than once.
    pub repeatable: &'static [&'static str],
    /// Whether `--` ends the flags; what follows is kept for [`Reader::rest`].
    pub dashes_end_flags: bool,
}

/// What a command line asks for: a run with these arguments, or a help or version text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command<A> {
    Run(Box<A>),
    Help,
    Version,
}

/// One flag as given; `value` is empty for a switch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flag {
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("unknown argument {arg}; see {program} --help")]
    Unknown { arg: String, program: &'static str },
    #[error("argument {0} needs a value")]
    MissingValue(String),
    #[error("argument {0} takes no value")]
    UnexpectedValue(String),
    #[error("argument {0} was given twice")]
    Duplicate(String),
}

/// Reads `args` (without the program name) as `spec` says.
#[derive(Debug)]
pub struct Reader<I> {
    args: I,
    spec: Spec,
    seen: Vec<String>,
    rest: Vec<String>,
}

impl<I: Iterator<Item = String>> Reader<I> {
    pub fn new(args: impl IntoIterator<IntoIter = I>, spec: Spec) -> Self {
        Reader {
            args: args.into_iter(),
            spec,
            seen: Vec::new(),
            rest: Vec::new(),
        }
    }

    /// The arguments after `--`, once the flags have been read.
    pub fn rest(self) -> Vec<String> {
        self.rest
    }

    fn next_flag(&mut self, arg: String) -> Result<Flag, Error> {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let spec = self.spec;
        let is = |list: &[&str]| list.contains(&name.as_str());
        let switch = is(spec.switches);
        let repeatable = is(spec.repeatable);
        if !switch && !repeatable && !is(spec.with_value) {
            return Err(Error::Unknown {
                arg,
                program: spec.program,
            });
        }
        if !repeatable && self.seen.contains(&name) {
            return Err(Error::Duplicate(name));
        }
        self.seen.push(name.clone());
        let value = match (switch, inline) {
            (true, Some(_)) => return Err(Error::UnexpectedValue(name)),
            (true, None) => String::new(),
            (false, Some(v)) => v,
            (false, None) => self
                .args
                .next()
                .ok_or_else(|| Error::MissingValue(name.clone()))?,
        };
        Ok(Flag { name, value })
    }
}

impl<I: Iterator<Item = String>> Iterator for Reader<I> {
    type Item = Result<Flag, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        let arg = self.args.next()?;
        if arg == "--" && self.spec.dashes_end_flags {
            self.rest = self.args.by_ref().collect();
            return None;
        }
        Some(self.next_flag(arg))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: Spec = Spec {
        program: "demo",
        with_value: &["--path"],
        switches: &["--quiet", "-h"],
        repeatable: &["--set"],
        dashes_end_flags: true,
    };

    fn read(args: &[&str]) -> (Result<Vec<Flag>, Error>, Vec<String>) {
        let mut reader = Reader::new(args.iter().map(|s| s.to_string()), SPEC);
        let flags = reader.by_ref().collect();
        (flags, reader.rest())
    }

    fn flag(name: &str, value: &str) -> Flag {
        Flag {
            name: name.into(),
            value: value.into(),
        }
    }

    #[test]
    fn both_spellings_switches_repeats_and_the_rest() {
        let (flags, rest) = read(&[
            "--path",
            "a",
            "--set=x=1",
            "--quiet",
            "--set",
            "y",
            "--",
            "--path",
            "b",
        ]);
        assert_eq!(
            flags.unwrap(),
            [
                flag("--path", "a"),
                flag("--set", "x=1"),
                flag("--quiet", ""),
                flag("--set", "y")
            ]
        );
        assert_eq!(rest, ["--path", "b"]);
    }

    #[test]
    fn mistakes_are_named() {
        let unknown = Error::Unknown {
            arg: "--bogus=1".into(),
            program: "demo",
        };
        assert_eq!(read(&["--bogus=1"]).0, Err(unknown.clone()));
        assert_eq!(
            unknown.to_string(),
            "unknown argument --bogus=1; see demo --help"
        );
        assert_eq!(
            read(&["--path"]).0,
            Err(Error::MissingValue("--path".into()))
        );
        assert_eq!(
            read(&["--quiet=yes"]).0,
            Err(Error::UnexpectedValue("--quiet".into()))
        );
        assert_eq!(
            read(&["--path", "a", "--path=b"]).0,
            Err(Error::Duplicate("--path".into()))
        );
    }
}

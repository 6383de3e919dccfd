//! The commands' standard output. A reader that closes the pipe early (`ckf lanes | head`)
//! ends the command quietly: a write that finds the pipe closed returns [`StdoutClosed`], which
//! `main` turns into exit 0 without a message, where `println!` would panic.
//!
//! Standard error is written with [`warn()`] (`errln!`), which ignores a closed or full stderr:
//! a diagnostic that cannot be shown must not turn a command's exit code into a panic's.
//!
//! SIGPIPE stays ignored, as the Rust runtime sets it: its default action would also kill the
//! client on a write to a socket the server has cut, before it could say why. And only writes
//! to standard output map to [`StdoutClosed`]: a broken pipe on a connection is an error.

use std::io::Write as _;

/// Standard output was closed by its reader.
#[derive(Debug, thiserror::Error)]
#[error("standard output was closed")]
pub struct StdoutClosed;

/// Writes `args` to standard output and flushes.
///
/// # Errors
/// [`StdoutClosed`] when the reader has gone; another write error with its cause.
pub fn write(args: std::fmt::Arguments<'_>) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_fmt(args).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        Err(e) => Err(anyhow::Error::new(e).context("writing to standard output")),
    }
}

/// `print!` to standard output through [`write()`]: evaluates to its `anyhow::Result<()>`.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::write(format_args!($($arg)*))
    };
}

/// `println!` to standard output through [`write()`]: evaluates to its `anyhow::Result<()>`.
#[macro_export]
macro_rules! outln {
    () => {
        $crate::out::write(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::out::write(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// Writes `args` to standard error, ignoring a failure (see the module docs).
pub fn warn(args: std::fmt::Arguments<'_>) {
    let _ = std::io::stderr().lock().write_fmt(args);
}

/// `eprintln!` through [`warn()`]: never panics.
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::out::warn(format_args!("{}\n", format_args!($($arg)*)))
    };
}

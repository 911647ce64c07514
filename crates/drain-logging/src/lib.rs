//! Logging set-up and error chains, shared by every binary of the project: `tracing` with an
//! `EnvFilter`, plain text (coloured on a terminal) or JSON lines, on stderr.

use std::io::IsTerminal;

/// Errors setting up logging.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The filter text is invalid.
    #[error("invalid log filter {filter:?}")]
    Filter {
        /// The filter text.
        filter: String,
        /// The cause.
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    /// A global subscriber was already installed.
    #[error("failed to install the log subscriber")]
    Install(#[source] tracing_subscriber::util::TryInitError),
}

/// Installs the global subscriber: `filter` in `EnvFilter` syntax, JSON lines if `json`.
pub fn init(filter: &str, json: bool) -> Result<(), LogError> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let env_filter =
        tracing_subscriber::EnvFilter::try_new(filter).map_err(|source| LogError::Filter {
            filter: filter.to_owned(),
            source,
        })?;
    let registry = tracing_subscriber::registry().with(env_filter);
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    if json {
        registry.with(fmt.json()).try_init()
    } else {
        registry.with(fmt).try_init()
    }
    .map_err(LogError::Install)
}

/// `error` and its sources, joined with `: ` (a source whose text is already in the message,
/// as some libraries include it, is not repeated).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("middle: inner")]
    struct Middle(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("inner")]
    struct Inner;

    #[test]
    fn chains_sources_without_repeating_them() {
        assert_eq!(error_chain(&Outer(Middle(Inner))), "outer: middle: inner");
    }

    #[test]
    fn a_bad_filter_is_an_error() {
        assert!(matches!(init("=[", false), Err(LogError::Filter { .. })));
    }
}

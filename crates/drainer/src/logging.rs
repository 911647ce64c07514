//! Logging setup: `tracing` with an `EnvFilter`, plain text or JSON lines on stderr.

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
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    if json {
        registry.with(fmt.json()).try_init()
    } else {
        registry.with(fmt).try_init()
    }
    .map_err(LogError::Install)
}

//! Small helpers shared by the command-line tools.

/// Parses a size with an optional binary suffix: `8`, `4k`, `1m`, `2g`.
///
/// ```
/// use ucx_stack::cli::parse_size;
/// assert_eq!(parse_size("64m"), Some(64 << 20));
/// assert_eq!(parse_size("8"), Some(8));
/// assert_eq!(parse_size("x"), None);
/// ```
pub fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 1 << 10),
        'm' | 'M' => (&s[..s.len() - 1], 1 << 20),
        'g' | 'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().ok()?.checked_mul(mult)
}

/// Logs to standard error, filtered by `RUST_LOG` (default: warnings).
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
}

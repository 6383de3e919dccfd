//! Error text for logs and messages: an error with every source under it.

/// Renders an error with its sources, `outer: inner: innermost` (`tonic::transport::Error`
/// alone says only "transport error"); a source whose text the rendering already ends with
/// (an error that shows its source in its own message) is not repeated.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn every_source_is_named_in_order() {
        let e = Outer(std::io::Error::other("inner"));
        assert_eq!(error_chain(&e), "outer: inner");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("outer: {0}")]
    struct Shows(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("context")]
    struct Context(#[source] Shows);

    #[test]
    fn a_source_already_in_the_message_is_not_repeated() {
        let e = Context(Shows(std::io::Error::other("inner")));
        assert_eq!(error_chain(&e), "context: outer: inner");
    }
}

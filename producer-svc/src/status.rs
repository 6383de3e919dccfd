//! The one place where the producer's errors become gRPC statuses.

use tonic::{Code, Status};

use crate::error::IngestError;

impl From<IngestError> for Status {
    fn from(e: IngestError) -> Self {
        let code = match e {
            IngestError::EmptySourceId
            | IngestError::SourceIdTooLong { .. }
            | IngestError::TooManyEvents { .. } => Code::InvalidArgument,
            IngestError::ShuttingDown => Code::Unavailable,
        };
        Status::new(code, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_follow_the_error_kind() {
        let s = Status::from(IngestError::EmptySourceId);
        assert_eq!(s.code(), Code::InvalidArgument);
        assert!(
            s.message().contains("source_id is required"),
            "{}",
            s.message()
        );
        let s = Status::from(IngestError::TooManyEvents { count: 9, max: 8 });
        assert_eq!(s.code(), Code::InvalidArgument);
        assert!(s.message().contains("9 events"), "{}", s.message());
        assert_eq!(
            Status::from(IngestError::ShuttingDown).code(),
            Code::Unavailable
        );
    }
}

//! The one place where the producer's errors become gRPC statuses.

use ckf_core::access::AccessError;
use ckf_core::pool_load::PushRefused;
use tonic::{Code, Status};

use crate::error::RequestError;

impl From<RequestError> for Status {
    fn from(e: RequestError) -> Self {
        let code = match e {
            RequestError::BadSourceId(_)
            | RequestError::BadRequestedSourceId(_)
            | RequestError::TooManyEvents { .. }
            | RequestError::MissingMember => Code::InvalidArgument,
            RequestError::BadLoadSourceId(_) => Code::InvalidArgument,
            RequestError::Load(PushRefused::Full { .. }) => Code::ResourceExhausted,
            RequestError::Load(PushRefused::Invalid { .. } | PushRefused::Scraped(_)) => {
                Code::InvalidArgument
            }
            RequestError::Quota(_) => Code::ResourceExhausted,
            RequestError::ShuttingDown => Code::Unavailable,
            RequestError::Access(AccessError::Unauthenticated(_)) => Code::Unauthenticated,
            RequestError::Access(AccessError::PermissionDenied(_)) => Code::PermissionDenied,
        };
        Status::new(code, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_follow_the_error_kind() {
        let s = Status::from(RequestError::BadSourceId(
            ckf_core::identity::SourceIdError::Empty,
        ));
        assert_eq!(s.code(), Code::InvalidArgument);
        assert!(
            s.message().contains("source_id is required"),
            "{}",
            s.message()
        );
        let s = Status::from(RequestError::BadRequestedSourceId(
            ckf_core::identity::SourceIdError::Empty,
        ));
        assert_eq!(s.code(), Code::InvalidArgument);
        assert!(
            s.message()
                .starts_with("GetSourceSequenceRequest.source_id is required"),
            "{}",
            s.message()
        );
        let s = Status::from(RequestError::TooManyEvents { count: 9, max: 8 });
        assert_eq!(s.code(), Code::InvalidArgument);
        assert!(s.message().contains("9 events"), "{}", s.message());
        let s = Status::from(RequestError::Quota(
            ckf_core::dc::QuotaError::BatchTooLarge { blocks: 9, max: 8 },
        ));
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert!(
            s.message().contains("max_blocks_per_batch is 8"),
            "{}",
            s.message()
        );
        assert_eq!(
            Status::from(RequestError::ShuttingDown).code(),
            Code::Unavailable
        );
        let s = Status::from(RequestError::Load(PushRefused::Invalid {
            field: "kv_usage",
            rule: "1.5 is not a number in 0..=1".into(),
        }));
        assert_eq!(s.code(), Code::InvalidArgument);
        assert!(
            s.message().starts_with("ReportLoadRequest.kv_usage: 1.5"),
            "{}",
            s.message()
        );
        let s = Status::from(RequestError::Load(PushRefused::Scraped(7)));
        assert_eq!(s.code(), Code::InvalidArgument);
        assert!(
            s.message()
                .starts_with("ReportLoadRequest.worker_id: worker 7"),
            "{}",
            s.message()
        );
        let s = Status::from(RequestError::Load(PushRefused::Full {
            worker_id: 9,
            limit: 4,
        }));
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert!(
            s.message().contains("max_pushed_workers"),
            "{}",
            s.message()
        );
        let s = Status::from(RequestError::BadLoadSourceId(
            ckf_core::identity::SourceIdError::Empty,
        ));
        assert_eq!(s.code(), Code::InvalidArgument);
        assert!(
            s.message().starts_with("ReportLoadRequest.source_id"),
            "{}",
            s.message()
        );
    }
}

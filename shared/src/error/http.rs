//! `ApiError` as an HTTP answer: the status from THE table (`code.rs`) and
//! the JSON body of DESIGN section 6, `{"error", "message", "retry", ...}`.

use super::ApiError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

impl ApiError {
    /// The HTTP status of this error's code.
    pub fn http_status(&self) -> StatusCode {
        StatusCode::from_u16(self.code.wire().http_status)
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.http_status(), axum::Json(self.json_body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    #[test]
    fn every_code_has_a_valid_http_status() {
        for code in ErrorCode::ALL {
            let e = ApiError::etcd(*code);
            assert_eq!(
                e.http_status().as_u16(),
                code.wire().http_status,
                "{code:?}"
            );
        }
    }

    #[tokio::test]
    async fn the_body_names_the_code_and_the_detail() {
        let response = ApiError::compacted(7).into_response();
        assert_eq!(response.status(), StatusCode::GONE);
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .expect("body");
        let json: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(json["error"], "compacted");
        assert_eq!(json["compact_revision"], 7);
        assert_eq!(json["retry"], "never");
    }
}

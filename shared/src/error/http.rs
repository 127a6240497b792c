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
        let mut response = (self.http_status(), axum::Json(self.json_body())).into_response();
        // A rate limit says when, in whole seconds (HTTP's Retry-After).
        if let Some(wait) = self.retry_after() {
            let seconds = wait.as_millis().div_ceil(1000).max(1);
            if let Ok(value) = axum::http::HeaderValue::from_str(&seconds.to_string()) {
                response
                    .headers_mut()
                    .insert(axum::http::header::RETRY_AFTER, value);
            }
        }
        response
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

    #[test]
    fn a_rate_limit_says_when_in_whole_seconds() {
        let response = ApiError::rate_limited("attempts", std::time::Duration::from_millis(1500))
            .into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[axum::http::header::RETRY_AFTER], "2");
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

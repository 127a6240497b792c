//! Operators' routes for the directory of cells (root only once
//! authentication is on): `GET /v1/admin/directory`,
//! `PUT /v1/admin/directory/cells/{name}` (add a cell) and
//! `PUT /v1/admin/directory/prefixes` (assign a prefix to a cell) and
//! `POST /v1/admin/directory/moves` (move a prefix with its keys). Every
//! change answers the new directory; the proxy that made it routes by it
//! at once, the others within their next read of it.

use super::extract::{Json, Path};
use super::model::ErrorBody;
use super::{answer, Answer};
use crate::ops::directory;
use crate::state::ProxyState;
use axum::extract::State;
use latchkey_shared::directory::Directory;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

/// The directory: which cell owns which prefix. A key under no assigned
/// prefix is the home cell's.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DirectoryView {
    /// Raised by every change; 0 before the first.
    pub version: u64,
    /// The cells besides `home` (the cell the proxies start with).
    pub cells: Vec<CellEntry>,
    /// Assigned prefixes, sorted.
    pub prefixes: Vec<PrefixEntry>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CellEntry {
    pub name: String,
    /// Its members' client addresses.
    pub endpoints: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PrefixEntry {
    pub prefix: String,
    pub cell: String,
}

/// A cell to add.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CellSettings {
    /// Its members' client addresses (`host:port`, or URLs).
    pub endpoints: Vec<String>,
}

/// A prefix and the cell to own it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Assignment {
    /// Every key starting with it: none of the other assigned prefixes
    /// may start with it, nor it with one of them.
    pub prefix: String,
    /// A cell of the directory; `home` returns the prefix to the home cell.
    pub cell: String,
}

fn view(d: Directory) -> DirectoryView {
    DirectoryView {
        version: d.version,
        cells: d
            .cells
            .into_iter()
            .map(|(name, endpoints)| CellEntry { name, endpoints })
            .collect(),
        prefixes: d
            .prefixes
            .into_iter()
            .map(|a| PrefixEntry {
                prefix: String::from_utf8_lossy(&a.prefix).into_owned(),
                cell: a.cell,
            })
            .collect(),
    }
}

/// The directory as the home cell holds it.
#[utoipa::path(get, path = "/v1/admin/directory", tag = "directory",
    responses((status = 200, body = DirectoryView), (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn show(State(state): State<Arc<ProxyState>>) -> Answer<DirectoryView> {
    answer(view(directory::show(&state).await?))
}

/// Add a cell. It must answer: it is told it owns no key until a prefix
/// is assigned to it. Adding it again at the same endpoints changes
/// nothing.
#[utoipa::path(put, path = "/v1/admin/directory/cells/{name}", tag = "directory",
    params(("name" = String, Path, description = "The cell: 1-64 characters of a-z, 0-9 and '-'")),
    request_body = CellSettings,
    responses((status = 200, body = DirectoryView),
        (status = 412, body = ErrorBody, description = "precondition_failed: the cell exists elsewhere, does not answer, or another change is running"),
        (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn add_cell(
    State(state): State<Arc<ProxyState>>,
    Path(name): Path<String>,
    Json(settings): Json<CellSettings>,
) -> Answer<DirectoryView> {
    answer(view(
        directory::add_cell(&state, &name, settings.endpoints).await?,
    ))
}

/// Assign a prefix to a cell. The prefix must hold no keys in the cell
/// that owns it now (moving keys online is not built yet).
#[utoipa::path(put, path = "/v1/admin/directory/prefixes", tag = "directory",
    request_body = Assignment,
    responses((status = 200, body = DirectoryView),
        (status = 412, body = ErrorBody, description = "precondition_failed: keys under the prefix, a cell that does not answer, or another change running"),
        (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn assign(
    State(state): State<Arc<ProxyState>>,
    Json(assignment): Json<Assignment>,
) -> Answer<DirectoryView> {
    answer(view(
        directory::assign(&state, assignment.prefix.as_bytes(), &assignment.cell).await?,
    ))
}

/// What a move did.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct MoveAnswer {
    pub directory: DirectoryView,
    /// The cell the prefix left.
    pub from: String,
    /// Keys copied at the move's start revision.
    pub copied: u64,
    /// Source revisions applied to the target after the copy.
    pub followed: u64,
    /// Milliseconds from the source's fence to the switch: writes under the
    /// prefix waited at most this long (other prefixes never wait).
    pub pause_ms: u64,
}

/// Move a prefix to another cell with its keys, sessions, locks and
/// elections, online: copied, followed, fenced for a short pause, switched.
#[utoipa::path(post, path = "/v1/admin/directory/moves", tag = "directory",
    request_body = Assignment,
    responses((status = 200, body = MoveAnswer),
        (status = 412, body = ErrorBody, description = "precondition_failed: already there, keys left in the target, a cell that does not answer, or another change running"),
        (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn move_prefix(
    State(state): State<Arc<ProxyState>>,
    Json(assignment): Json<Assignment>,
) -> Answer<MoveAnswer> {
    let moved =
        directory::move_prefix(&state, assignment.prefix.as_bytes(), &assignment.cell).await?;
    answer(MoveAnswer {
        directory: view(moved.directory),
        from: moved.from,
        copied: moved.copied as u64,
        followed: moved.followed as u64,
        pause_ms: moved.pause.as_millis() as u64,
    })
}

//! Tokens for every cell. Each cell signs its tokens with keys only its
//! members hold, so one cell's token means nothing to another. A client
//! that authenticates through a proxy while the directory names other
//! cells is answered with one token carrying a token of each cell that
//! authenticated it (the user exists there with that password):
//! `lkc~<cell id>~<token>~<cell id>~<token>...`, cell ids (etcd's cluster
//! ids) in hex, home's first. A cell's own tokens are base64url with a dot,
//! never a `~`, and `~` is a token character of HTTP's bearer scheme.
//!
//! The proxy sends each cell its own part ([`for_cell`]). To a client the
//! token is as opaque as etcd's and as short-lived: each part lives
//! `TOKEN_TTL`. A cell the client's token has no part for (added after it
//! authenticated) is sent home's part and refuses it as an invalid token,
//! and etcd's clients authenticate again on that answer.

/// What every joined token starts with.
const JOINED: &str = "lkc~";

/// One token of `parts` (each a cell's id and its token, home's first); a
/// single part is that cell's token as it is.
pub fn join(parts: &[(u64, String)]) -> String {
    if let [(_, only)] = parts {
        return only.clone();
    }
    let mut joined = String::from(JOINED);
    for (i, (cell, token)) in parts.iter().enumerate() {
        if i > 0 {
            joined.push('~');
        }
        joined.push_str(&format!("{cell:x}~{token}"));
    }
    joined
}

/// The part of `token` for the cell whose id is `cell`: the token itself
/// unless it is joined; home's part when it has none for the cell (or the
/// cell's id is not known yet).
pub fn for_cell(token: &str, cell: Option<u64>) -> &str {
    let Some(parts) = token.strip_prefix(JOINED) else {
        return token;
    };
    let mut fields = parts.split('~');
    let mut first = None;
    while let (Some(id), Some(part)) = (fields.next(), fields.next()) {
        first.get_or_insert(part);
        if cell.is_some_and(|c| u64::from_str_radix(id, 16) == Ok(c)) {
            return part;
        }
    }
    first.unwrap_or(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cell_gets_its_own_part_and_an_unknown_cell_homes() {
        let one = join(&[(0xa1, "home.tok".into())]);
        assert_eq!(one, "home.tok", "one cell: its token as it is");
        assert_eq!(for_cell(&one, Some(0xa1)), "home.tok");
        let joined = join(&[(0xa1, "home.tok".into()), (0xb2, "b-_.tok".into())]);
        assert_eq!(joined, "lkc~a1~home.tok~b2~b-_.tok");
        assert_eq!(for_cell(&joined, Some(0xa1)), "home.tok");
        assert_eq!(for_cell(&joined, Some(0xb2)), "b-_.tok");
        assert_eq!(
            for_cell(&joined, Some(0xc3)),
            "home.tok",
            "a cell added since"
        );
        assert_eq!(for_cell(&joined, None), "home.tok", "an id not known yet");
        // Hostile input comes back as it is, to be refused by the cell.
        assert_eq!(for_cell("lkc~", Some(1)), "lkc~");
        assert_eq!(for_cell("lkc~zz", Some(1)), "lkc~zz");
        assert_eq!(for_cell("lkc~zz~t", Some(1)), "t");
    }
}

//! Roles by bearer token. With no tokens configured (allowed only on a
//! loopback bind) everyone is an operator; otherwise a request without a
//! known token is an anonymous viewer. Each configured token is an
//! [`Account`]: rate limits, agent caps and ownership are kept per token,
//! the same over REST and the WebSocket.

use starling_protocol::Role;

use crate::command::{Account, Actor};

/// The configured tokens, each with the role it grants.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    granted: Vec<(String, Role)>,
}

impl Tokens {
    /// Tokens for each role (any number each).
    pub fn new(viewer: &[String], pilot: &[String], operator: &[String]) -> Self {
        let mut granted = Vec::new();
        for (tokens, role) in [
            (viewer, Role::Viewer),
            (pilot, Role::Pilot),
            (operator, Role::Operator),
        ] {
            granted.extend(tokens.iter().map(|t| (t.clone(), role)));
        }
        Self { granted }
    }

    /// Whether any token is configured.
    pub fn any(&self) -> bool {
        !self.granted.is_empty()
    }

    /// Who a presented token (or none) is. Every configured token is
    /// compared in constant time, so timing reveals neither which matched
    /// nor how much of one did.
    pub fn actor(&self, presented: Option<&str>) -> Actor {
        if !self.any() {
            return Actor::OPERATOR;
        }
        let anonymous = Actor {
            role: Role::Viewer,
            account: None,
        };
        let Some(t) = presented else {
            return anonymous;
        };
        let mut found = anonymous;
        for (k, (token, role)) in self.granted.iter().enumerate() {
            if ct_eq(token.as_bytes(), t.as_bytes()) {
                found = Actor {
                    role: *role,
                    account: Some(Account(k as u16)),
                };
            }
        }
        found
    }
}

impl Tokens {
    /// Whether a token was presented that none of the configured ones
    /// matches (its caller is treated as an anonymous viewer, and told).
    pub fn unknown(&self, presented: Option<&str>) -> bool {
        presented.is_some() && self.any() && self.actor(presented).account.is_none()
    }

    /// The token an account was granted (an edge forwards it to the
    /// origin, which resolves it again with its own table).
    pub fn token_of(&self, account: Account) -> Option<&str> {
        self.granted
            .get(usize::from(account.0))
            .map(|(t, _)| t.as_str())
    }
}

fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The token in an `Authorization: Bearer …` header value (the scheme's
/// name in any case, as RFC 7235 has it).
pub fn bearer(header: Option<&str>) -> Option<&str> {
    let header = header?;
    let scheme = header.get(..7)?;
    scheme
        .eq_ignore_ascii_case("bearer ")
        .then(|| header[7..].trim())
}

/// `?token=` on a URL: how a browser presents a token where it cannot set
/// headers (the WebSocket's).
#[derive(Debug, Default, serde::Deserialize)]
pub struct TokenQuery {
    /// The token.
    pub token: Option<String>,
}

impl TokenQuery {
    /// The token a request presents: the URL's, else its `Authorization:
    /// Bearer` header's (the order the socket and the request guard share).
    pub fn presented<'a>(&'a self, headers: &'a axum::http::HeaderMap) -> Option<&'a str> {
        let header = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        self.token
            .as_deref()
            .filter(|t| !t.is_empty())
            .or(bearer(header))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_presents_its_url_token_else_its_header_token() {
        let mut headers = axum::http::HeaderMap::new();
        let none = TokenQuery::default();
        assert_eq!(none.presented(&headers), None);
        headers.insert(
            axum::http::header::AUTHORIZATION,
            "Bearer from-header".parse().unwrap(),
        );
        assert_eq!(none.presented(&headers), Some("from-header"));
        let url = TokenQuery {
            token: Some("from-url".into()),
        };
        assert_eq!(url.presented(&headers), Some("from-url"));
        let empty = TokenQuery {
            token: Some(String::new()),
        };
        assert_eq!(
            empty.presented(&headers),
            Some("from-header"),
            "an empty ?token= is none"
        );
        assert_eq!(
            url.presented(&axum::http::HeaderMap::new()),
            Some("from-url")
        );
    }

    #[test]
    fn roles_and_accounts_follow_tokens() {
        assert_eq!(Tokens::default().actor(None), Actor::OPERATOR);
        let s = |v: &[&str]| v.iter().map(|t| t.to_string()).collect::<Vec<_>>();
        let t = Tokens::new(&[], &s(&["p1", "p2"]), &s(&["o"]));
        assert!(t.unknown(Some("nope")));
        assert!(!t.unknown(Some("p2")) && !t.unknown(None));
        assert!(
            !Tokens::default().unknown(Some("any")),
            "no tokens: everyone operates"
        );
        assert_eq!(t.actor(None).role, Role::Viewer);
        assert_eq!(t.actor(Some("x")).role, Role::Viewer);
        assert_eq!(t.actor(Some("x")).account, None);
        let (p1, p2) = (t.actor(Some("p1")), t.actor(Some("p2")));
        assert_eq!((p1.role, p2.role), (Role::Pilot, Role::Pilot));
        assert_ne!(p1.account, p2.account);
        assert_eq!(t.actor(Some("o")).role, Role::Operator);
        assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")), None);
    }
}

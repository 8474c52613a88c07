//! Roles by bearer token. With no tokens configured (allowed only on a
//! loopback bind) everyone is an operator; otherwise a request without a
//! known token is a viewer.

use starling_protocol::{CommandKind, Role};

/// The configured tokens.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    /// Tokens that grant `viewer`.
    pub viewer: Option<String>,
    /// Tokens that grant `pilot`.
    pub pilot: Option<String>,
    /// Tokens that grant `operator`.
    pub operator: Option<String>,
}

impl Tokens {
    /// Whether any token is configured.
    pub fn any(&self) -> bool {
        self.viewer.is_some() || self.pilot.is_some() || self.operator.is_some()
    }

    /// The role a presented token (or none) grants. Comparison is
    /// constant-time in the token's length so timing reveals nothing.
    pub fn role_of(&self, presented: Option<&str>) -> Role {
        if !self.any() {
            return Role::Operator;
        }
        let Some(t) = presented else {
            return Role::Viewer;
        };
        let eq = |want: &Option<String>| {
            want.as_deref()
                .is_some_and(|w| ct_eq(w.as_bytes(), t.as_bytes()))
        };
        if eq(&self.operator) {
            Role::Operator
        } else if eq(&self.pilot) {
            Role::Pilot
        } else {
            Role::Viewer
        }
    }
}

fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The least role that may send a kind of command.
pub fn needed_role(kind: CommandKind) -> Role {
    match kind {
        CommandKind::Predator | CommandKind::Goal | CommandKind::Obstacle => Role::Pilot,
        CommandKind::Boids | CommandKind::Params | CommandKind::Control => Role::Operator,
    }
}

/// The command kinds a role may send.
pub fn allowed(role: Role) -> Vec<CommandKind> {
    [
        CommandKind::Predator,
        CommandKind::Goal,
        CommandKind::Obstacle,
        CommandKind::Boids,
        CommandKind::Params,
        CommandKind::Control,
    ]
    .into_iter()
    .filter(|&k| role >= needed_role(k))
    .collect()
}

/// The token in an `Authorization: Bearer …` header value.
pub fn bearer(header: Option<&str>) -> Option<&str> {
    header?.strip_prefix("Bearer ").map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_follow_tokens() {
        let open = Tokens::default();
        assert_eq!(open.role_of(None), Role::Operator);
        let t = Tokens {
            viewer: None,
            pilot: Some("p".into()),
            operator: Some("o".into()),
        };
        assert_eq!(t.role_of(None), Role::Viewer);
        assert_eq!(t.role_of(Some("x")), Role::Viewer);
        assert_eq!(t.role_of(Some("p")), Role::Pilot);
        assert_eq!(t.role_of(Some("o")), Role::Operator);
        assert_eq!(allowed(Role::Viewer), vec![]);
        assert_eq!(allowed(Role::Pilot).len(), 3);
        assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")), None);
    }
}

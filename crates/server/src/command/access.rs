//! Who may do what. One table gives the least role for each kind of
//! command ([`needed_role`]); REST routes, WebSocket commands and the
//! viewer's `Hello` all read it. Pilots also have an ownership rule (an
//! agent a pilot created is that pilot's token's: other pilots may not move
//! or remove it) and caps on the agents they hold, kept by the [`Ledger`]
//! that the tick loop owns, so both are checked where the op is applied,
//! whatever transport it came by.

use std::collections::HashMap;

use starling_protocol::{CommandKind, Role};
use starling_sim::{Agents, Flock, ParamError};

use super::{Applied, OnAgents, Op, OpError};

/// The least role that may send a kind of command: the one permission table.
pub fn needed_role(kind: CommandKind) -> Role {
    match kind {
        CommandKind::Predator | CommandKind::Goal | CommandKind::Obstacle => Role::Pilot,
        CommandKind::Boids | CommandKind::Params | CommandKind::Control => Role::Operator,
    }
}

/// The command kinds a role may send (for the viewer's `Hello`).
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

/// A configured token, by its place in the configuration: what rate
/// buckets, caps and ownership are kept per (never the token itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Account(pub u16);

/// Who asks for an op: a role, and the token it came with (none for an
/// anonymous caller, or when no tokens are configured).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Actor {
    /// The role the token grants.
    pub role: Role,
    /// The token's account.
    pub account: Option<Account>,
}

impl Actor {
    /// An operator with no token: the open loopback server, scenario files.
    pub const OPERATOR: Actor = Actor {
        role: Role::Operator,
        account: None,
    };
}

/// Refuses an op the actor's role may never send. `agents` decides the
/// kind of an agent a move or removal names.
pub fn check_role(actor: Actor, op: &Op, agents: &Agents) -> Result<(), OpError> {
    let need = needed_role(op.kind(agents));
    if actor.role >= need {
        Ok(())
    } else {
        Err(OpError::Forbidden {
            what: op.name(),
            need,
            have: actor.role,
        })
    }
}

/// Caps on the agents pilots hold at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentCaps {
    /// Per pilot token.
    pub each: usize,
    /// All pilots together.
    pub total: usize,
}

/// What the ledger enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Pilots' agents.
    pub pilots: AgentCaps,
    /// Boids in the flock, for everyone.
    pub max_population: usize,
}

/// Which pilot created which live agent. Owned by the tick loop: an op is
/// admitted (role, ownership, caps) and settled (what it created or
/// removed) at the tick boundary it applies at, so concurrent requests can
/// never overshoot a cap, whichever transport they came by. Agents created
/// by operators and scenarios have no owner: only operators touch them.
/// Kept in memory only: after a restart pilots' agents belong to no one.
#[derive(Debug)]
pub struct Ledger {
    caps: Caps,
    owners: HashMap<u32, Account>,
}

impl Ledger {
    /// An empty ledger enforcing `caps`.
    pub fn new(caps: Caps) -> Self {
        Self {
            caps,
            owners: HashMap::new(),
        }
    }

    /// Refuses what `actor` may not do to `flock` now: a role too low, a
    /// pilot touching an agent it does not own, or a pilot at a cap.
    pub fn admit(&mut self, actor: Actor, op: &Op, flock: &Flock) -> Result<(), OpError> {
        let agents = flock.agents();
        check_role(actor, op, agents)?;
        self.check_population(op, flock.len())?;
        if actor.role != Role::Pilot {
            return Ok(());
        }
        let effect = op.on_agents();
        if let Some(id) = effect.target()
            && agents.kind_of(id).is_some()
            && self.owners.get(&id).copied() != actor.account
        {
            return Err(OpError::NotOwner { id });
        }
        if effect == OnAgents::Creates {
            // Expired agents stop counting.
            self.owners.retain(|&id, _| agents.kind_of(id).is_some());
            let mine = self
                .owners
                .values()
                .filter(|&&a| Some(a) == actor.account)
                .count();
            if mine >= self.caps.pilots.each {
                return Err(OpError::LimitReached(format!(
                    "a pilot may have {} agents at once",
                    self.caps.pilots.each
                )));
            }
            if self.owners.len() >= self.caps.pilots.total {
                return Err(OpError::LimitReached(format!(
                    "pilots together may have {} agents at once",
                    self.caps.pilots.total
                )));
            }
        }
        Ok(())
    }

    /// Refuses growing the flock past `max_population`.
    fn check_population(&self, op: &Op, now: usize) -> Result<(), OpError> {
        let max = self.caps.max_population;
        match *op {
            Op::SetPopulation { population } if population > max => Err(OpError::Sim(
                ParamError::new(
                    "population",
                    population,
                    format!("0 ..= {max} (max_population)"),
                )
                .into(),
            )),
            Op::SpawnBoids { count, .. } if now.saturating_add(count) > max => {
                Err(OpError::LimitReached(format!(
                    "{count} more boids would make {}: the flock may have at most {max} (max_population)",
                    now.saturating_add(count)
                )))
            }
            _ => Ok(()),
        }
    }

    /// Records what an admitted op did (`effect` is its [`Op::on_agents`]).
    pub fn settle(&mut self, actor: Actor, effect: OnAgents, applied: &Applied) {
        match effect {
            OnAgents::RemovesAll => self.owners.clear(),
            OnAgents::Removes(id) => {
                self.owners.remove(&id);
            }
            OnAgents::Creates => {
                if let (Role::Pilot, Some(id), Some(account)) =
                    (actor.role, applied.id, actor.account)
                {
                    self.owners.insert(id, account);
                }
            }
            OnAgents::Touches(_) | OnAgents::Nothing => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_role_sends_what_the_table_allows() {
        assert_eq!(allowed(Role::Viewer), vec![]);
        assert_eq!(
            allowed(Role::Pilot),
            vec![
                CommandKind::Predator,
                CommandKind::Goal,
                CommandKind::Obstacle
            ]
        );
        assert_eq!(allowed(Role::Operator).len(), 6);
    }
}

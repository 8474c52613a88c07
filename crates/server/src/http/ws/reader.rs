//! The reading half of a viewer's connection: decodes what the client
//! sends, answers through the [`Outbox`], and submits commands through the
//! same door as REST. Work one client can start is bounded: at most
//! [`MAX_CLIENT_MESSAGES_PER_S`] messages a second (past it the connection
//! ends: each one may be answered, a pong or an error), at most
//! [`MAX_COMMANDS_IN_FLIGHT`] commands at once, none while its replies are
//! backing up, and the connection ends as soon as they overflow.

use std::sync::Arc;

use axum::extract::ws::{Message, WebSocket};
use futures_util::StreamExt;
use futures_util::stream::SplitStream;
use starling_protocol::{
    Ack, ClientMsg, CloseReason, Command, ErrorCode, ServerMsg, View, command_request_id,
    decode_client,
    limits::{MAX_CLIENT_MESSAGES_PER_S, MAX_VIEW_UPDATES_PER_S},
};
use tokio::sync::{Semaphore, mpsc, watch};

use super::outbox::{Ending, Outbox};
use super::{encode, error_msg};
use crate::command::{Actor, Applied, op_from_command};
use crate::http::error::ApiError;
use crate::http::rate::RateBuckets;
use crate::http::shared::Shared;

/// Commands one connection may have waiting for the tick loop at once.
pub const MAX_COMMANDS_IN_FLIGHT: usize = 16;

/// What the reader hands the writer besides replies.
#[derive(Debug)]
pub(super) struct ToWriter {
    /// A new snapshot rate.
    pub(super) rate: mpsc::Sender<u16>,
    /// A request for a keyframe.
    pub(super) resync: mpsc::Sender<()>,
    /// View updates (None: the viewer is on the whole-world stream).
    pub(super) view: Option<watch::Sender<Option<View>>>,
}

/// Reads until the client leaves or breaks the protocol, then ends the
/// connection through the outbox; returns whether the client closed the
/// socket itself (after the server's Close, or before).
pub(super) async fn read_loop(
    s: Shared,
    mut stream: SplitStream<WebSocket>,
    actor: Actor,
    outbox: Outbox,
    to_writer: ToWriter,
) -> bool {
    let in_flight = Arc::new(Semaphore::new(MAX_COMMANDS_IN_FLIGHT));
    // View updates: MAX_VIEW_UPDATES_PER_S a second, in bursts of as many.
    let per_s = MAX_VIEW_UPDATES_PER_S as f32;
    let views = RateBuckets::<()>::new(per_s, per_s);
    // Every message: MAX_CLIENT_MESSAGES_PER_S a second, in bursts of as many.
    let per_s = MAX_CLIENT_MESSAGES_PER_S as f32;
    let messages = RateBuckets::<()>::new(per_s, per_s);
    // Whether the stream broke (a message over the size limit, a bad
    // frame): it reads nothing more, whatever the socket still holds.
    let mut broken = false;
    let ending = loop {
        let next = stream.next().await;
        // WebSocket pings count too: each is answered with a pong.
        let counted = matches!(&next, Some(Ok(m)) if !matches!(m, Message::Close(_)));
        if counted && !messages.take(()) {
            break Ending::Refused(
                CloseReason::ProtocolError,
                format!(
                    "messages: more than {MAX_CLIENT_MESSAGES_PER_S} a second on one connection (allowed: {MAX_CLIENT_MESSAGES_PER_S} a second, in bursts of as many)"
                ),
            );
        }
        let bytes = match next {
            None | Some(Ok(Message::Close(_))) => break Ending::ClientLeft,
            Some(Err(e)) => {
                broken = left_unread(&e);
                break Ending::Refused(
                    CloseReason::ProtocolError,
                    format!("unreadable message: {e}"),
                );
            }
            Some(Ok(Message::Binary(b))) => b,
            Some(Ok(Message::Text(_))) => {
                outbox.push_or_end(error_msg(
                    None,
                    ErrorCode::BadRequest,
                    None,
                    "text frames are not part of the protocol; send binary",
                ));
                continue;
            }
            Some(Ok(_)) => continue,
        };
        let reply = match decode_client(&bytes) {
            // A command that breaks a limit is answered under its id, the
            // error naming the field.
            Err(e) => Some(error_msg(
                command_request_id(&bytes),
                ErrorCode::BadRequest,
                e.field(),
                &e.to_string(),
            )),
            Ok(ClientMsg::Subscribe { .. }) => Some(error_msg(
                None,
                ErrorCode::BadRequest,
                None,
                "already subscribed; use SetRate to change the rate",
            )),
            Ok(ClientMsg::SetRate { max_fps }) => {
                let _ = to_writer.rate.try_send(max_fps);
                None
            }
            Ok(ClientMsg::Resync) => {
                let _ = to_writer.resync.try_send(());
                None
            }
            Ok(ClientMsg::Ping { nonce }) => Some(encode(&ServerMsg::Pong {
                nonce,
                tick: s.state().tick,
            })),
            Ok(ClientMsg::Command {
                request_id,
                command,
            }) => start_command(&s, actor, &outbox, &in_flight, request_id, command),
            Ok(ClientMsg::SetView(v)) => set_view(to_writer.view.as_ref(), &views, v),
        };
        if let Some(r) = reply {
            outbox.push_or_end(r);
        }
        if outbox.ended() {
            break Ending::ClientLeft; // someone else ended it first
        }
    };
    let left = ending == Ending::ClientLeft && !outbox.ended();
    outbox.end(ending);
    if left {
        return true;
    }
    if broken {
        // The rest of what the client sent (the rest of a message over
        // the limit) stays unread: the writer lingers after its Close.
        // Read as answered, the socket went at once and was reset, and the
        // client lost the Close about one time in six.
        return false;
    }
    // Keep reading (and dropping) what the client still sends until it
    // answers the Close: a socket closed with unread data is reset, and a
    // reset can destroy the Close before the client reads it.
    loop {
        match stream.next().await {
            Some(Ok(Message::Close(_))) | None => return true,
            Some(Ok(_)) => {}
            Some(Err(_)) => return false,
        }
    }
}

/// Whether a read failed with bytes of the client's still unread: a
/// message or frame over the size limit (tungstenite's capacity error,
/// "Space limit exceeded", whose header was read and its payload not). A
/// client that went away (a reset, an end without a closing handshake)
/// left nothing to read, and its connection need not linger.
fn left_unread(e: &axum::Error) -> bool {
    e.to_string().contains("Space limit exceeded")
}

/// Hands a checked view to the writer, or says why not.
fn set_view(
    to: Option<&watch::Sender<Option<View>>>,
    rate: &RateBuckets<()>,
    v: View,
) -> Option<axum::body::Bytes> {
    let Some(to) = to else {
        return Some(error_msg(
            None,
            ErrorCode::Unsupported,
            Some("view"),
            "this connection is on the whole-world stream: subscribe with a view to use views",
        ));
    };
    if !rate.take(()) {
        return Some(error_msg(
            None,
            ErrorCode::RateLimited,
            Some("view"),
            &format!("at most {MAX_VIEW_UPDATES_PER_S} view updates a second; this one is ignored"),
        ));
    }
    if let Err(e) = v.check() {
        let detail = format!("{} = {}: allowed {}", e.field, e.value, e.allowed);
        return Some(error_msg(
            None,
            ErrorCode::BadRequest,
            Some(&e.field),
            &detail,
        ));
    }
    to.send_replace(Some(v));
    None
}

/// Starts a command on a task of its own (so a slow op never blocks
/// reading), or refuses it at once: while replies back up, or with
/// [`MAX_COMMANDS_IN_FLIGHT`] already waiting.
fn start_command(
    s: &Shared,
    actor: Actor,
    outbox: &Outbox,
    in_flight: &Arc<Semaphore>,
    request_id: u32,
    command: Command,
) -> Option<axum::body::Bytes> {
    let busy = |detail: String| Some(error_msg(Some(request_id), ErrorCode::Busy, None, &detail));
    if outbox.backed_up() {
        return busy("replies are backing up: read them before sending more commands".into());
    }
    let Ok(permit) = in_flight.clone().try_acquire_owned() else {
        return busy(format!(
            "at most {MAX_COMMANDS_IN_FLIGHT} commands in flight per connection; wait for their replies"
        ));
    };
    let (s, outbox) = (s.clone(), outbox.clone());
    tokio::spawn(async move {
        let out = match command_reply(&s, actor, command).await {
            Ok(a) => encode(&ServerMsg::Ack(Ack {
                request_id,
                tick: a.tick,
                id: a.id,
            })),
            Err(e) => error_msg(Some(request_id), e.code(), e.field.as_deref(), &e.detail),
        };
        drop(permit);
        outbox.push_or_end(out);
    });
    None
}

/// A command's outcome: its op, through the same door as REST.
async fn command_reply(s: &Shared, actor: Actor, command: Command) -> Result<Applied, ApiError> {
    // The one field the wire names otherwise than the op (REST's name).
    let set_population = matches!(command, Command::SetPopulation { .. });
    let op = op_from_command(command)?;
    s.submit(actor, op).await.map_err(|mut e| {
        if set_population && e.field.as_deref() == Some("population") {
            e.field = Some("count".into());
            e.detail = e.detail.replacen("population", "count", 1);
        }
        e
    })
}

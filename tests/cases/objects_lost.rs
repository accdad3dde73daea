//! Large payloads' objects lost where their pointers were not (issue 56): the bucket's
//! stream syncs on its own timer, so a power loss can keep a pointer and take its object's
//! chunks. `verify` names such a row, the durability horizon's look stores the object
//! again before the slot moves past it, and so does the start after a power loss.

use std::time::{Duration, Instant};

use super::large_payloads::{BUCKET, MIB, bucket, fetched, payload, row, servers_with, stored};
use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{Stored, read_all};
use crate::support::{eventually, stop_and_wait_released, wait_until_streaming};

/// The issue 56 case: a power loss keeps a pointer and loses its object's chunks (here purged
/// from the bucket's stream). `verify` looks at each pointer's object (listed, its size and
/// digest, every chunk there): the row is named missing, and `--replay-missing` stores it
/// again through the running pgoutbox, with an object of its own. Before, `verify` took the
/// pointer's digest header for the payload and said nothing was missing.
#[tokio::test(flavor = "multi_thread")]
async fn a_pointer_whose_chunks_were_lost_is_named_by_verify_and_stored_again() {
    let (pg, nats, js) = servers_with(bucket()).await;
    let app = Pgoutbox::run(&pg, &nats, &["--object-store", BUCKET]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&row(0, 2 * MIB, 'a'));
    pg.psql(&row(1, 100, 'b'));
    let messages = stored(&js, 2).await;
    let id = messages[0].header("Nats-Msg-Id").expect("an id").to_owned();
    let verify = |args: &[&str]| {
        let out = crate::support::pgoutbox::command(&pg, &nats)
            .env_remove("RUST_LOG")
            .arg("verify")
            .args(args)
            .output()
            .expect("pgoutbox verify runs");
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let (code, out) = verify(&[]);
    assert_eq!(code, Some(0), "whole before the loss:\n{out}");

    let chunks = js.get_stream(format!("OBJ_{BUCKET}")).await.expect("the bucket's stream");
    chunks.purge().filter(format!("$O.{BUCKET}.C.>")).await.expect("the chunks lost");
    let (code, out) = verify(&["--replay-missing"]);
    assert_eq!(code, Some(2), "{out}\n{}", app.log());
    assert!(out.contains("1 missing") && out.contains(&id), "{out}");
    let (code, out) = verify(&[]);
    assert_eq!(code, Some(0), "after the replay:\n{out}\n{}", app.log());
    let messages = read_all(&js, "OUTBOX").await;
    let again = messages.last().expect("the replayed row");
    assert_eq!(fetched(&js, again).await, payload(2 * MIB, 'a'), "stored again, whole");
    stop_and_wait_released(&pg, app).await;
}

/// Within the durability horizon, a power loss may keep a pointer and lose its object's
/// chunks (the bucket's stream syncs on its own timer): here they are purged right after
/// the pointer's ack. The horizon's look checks every pointer's object before it vouches:
/// the attempt ends, the row's object is stored again from the slot's copy of the row, and
/// only then is the slot confirmed past it. Before, the look checked the pointer alone and
/// the object stayed lost.
#[tokio::test(flavor = "multi_thread")]
async fn an_object_lost_within_the_horizon_is_stored_again_before_the_slot_moves_past_it() {
    let (pg, nats, js) = servers_with(bucket()).await;
    let app = Pgoutbox::run(&pg, &nats, &["--object-store", BUCKET, "--durability-horizon", "3s"]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&row(0, 2 * MIB, 'a'));
    let messages = stored(&js, 1).await;
    let chunks = js.get_stream(format!("OBJ_{BUCKET}")).await.expect("the bucket's stream");
    chunks.purge().filter(format!("$O.{BUCKET}.C.>")).await.expect("the chunks lost");
    pg.psql(&row(1, 100, 'b'));

    stored_again_once(&app, &js, &messages[0]).await;
    super::nats_forgets::slot_confirmed_everything(&pg).await;
    stop_and_wait_released(&pg, app).await;
}

/// A power loss with each stream on its own sync timer: the bucket loses the object of a
/// pointer the stream keeps, and the stream loses the message after that pointer. The
/// next start names the stream's loss, and must still look at the objects of the pointers
/// it kept: the object is stored again at once, from the slot's copy of the row. Before,
/// naming the loss forgot every pointer waiting for a look, and the object stayed lost
/// while the slot moved past it (the 3-minute soak with large events, seed 2: 2 objects).
#[tokio::test(flavor = "multi_thread")]
async fn a_power_loss_that_took_an_object_and_the_stream_s_tail_stores_the_object_again() {
    let (pg, mut nats, js) = servers_with(bucket()).await;
    let args = ["--object-store", BUCKET, "--durability-horizon", "60s"];
    let app = Pgoutbox::run(&pg, &nats, &args);
    wait_until_streaming(&pg, &app).await;
    let before_the_object = Instant::now();
    pg.psql(&row(0, 2 * MIB, 'a'));
    let messages = stored(&js, 1).await;
    let after_the_pointer = Instant::now();
    pg.psql(&row(1, 100, 'b'));
    stored(&js, 2).await;
    let chunks = format!("OBJ_{BUCKET}");
    let cuts = [("OUTBOX", after_the_pointer.elapsed()), (&*chunks, before_the_object.elapsed())];
    let cut = nats.lose_stored_within_each(&cuts);
    assert!(cut >= 2, "the object's records and the second message cut: {cut}");
    nats.start_again();

    stored_again_once(&app, &js, &messages[0]).await;
    stop_and_wait_released(&pg, app).await;
}

/// pgoutbox says it stored the object of `pointer` (row 0, 2 MiB of 'a') again, the object
/// is whole, and the stream holds rows 0 and 1 each once.
async fn stored_again_once(app: &Pgoutbox, js: &async_nats::jetstream::Context, pointer: &Stored) {
    eventually(Duration::from_secs(30), "the object stored again", || async {
        app.log().contains("its chunks, not its message").then_some(())
    })
    .await;
    let again = tokio::time::timeout(Duration::from_secs(20), fetched(js, pointer)).await;
    assert!(again.is_ok_and(|bytes| bytes == payload(2 * MIB, 'a')), "{}", app.log());
    let messages = stored(js, 2).await;
    assert_eq!(messages.len(), 2, "each row once: {}", app.log());
}

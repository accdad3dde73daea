//! Driving the model: every order of steps from a state (depth first, each state once), or
//! one run whose choices are given.

use std::collections::HashSet;

use super::{Broken, World};

/// Plays every order of steps from `world`, depth first, each state once.
pub(super) fn explore(world: World, limit: usize) -> Result<usize, Broken> {
    explore_checking(world, limit, false)
}

/// As [`explore`], and from each state where the stream holds a staged id, the run without
/// more faults must end with every row stored, staging no id anew once answered "staged":
/// liveness, which the search alone does not see (it visits a cycle once).
pub(super) fn explore_live(world: World, limit: usize) -> Result<usize, Broken> {
    explore_checking(world, limit, true)
}

fn explore_checking(world: World, limit: usize, live: bool) -> Result<usize, Broken> {
    let mut seen = HashSet::new();
    let mut stack = vec![(world, Vec::new())];
    while let Some((world, trace)) = stack.pop() {
        if !seen.insert(world.fingerprint()) {
            continue;
        }
        if seen.len() > limit {
            return Err(Broken::from(format!("more than {limit} states")));
        }
        if live && world.jetstream.holds_staged() {
            let mut continuation = world.clone();
            continuation.strict_staging = true;
            play(continuation, &[])
                .map_err(|Broken(err)| Broken(format!("{err}, from the state after {trace:?}")))?;
        }
        let steps = world.steps();
        if steps.iter().all(|step| step.is_fault()) {
            world.check_done().map_err(|Broken(err)| Broken(format!("{err} after {trace:?}")))?;
            continue;
        }
        for step in steps {
            let mut next = world.clone();
            let mut trace = trace.clone();
            trace.push(step);
            next.apply(step).map_err(|Broken(err)| Broken(format!("{err} after {trace:?}")))?;
            if trace.len() > 200 {
                return Err(Broken::from(format!("no end in sight after {trace:?}")));
            }
            stack.push((next, trace));
        }
    }
    Ok(seen.len())
}

/// Plays one run: each choice picks among the steps possible then; once the choices are
/// used up, the first step that is not a fault, until none is left.
pub(super) fn play(mut world: World, choices: &[u8]) -> Result<(), Broken> {
    let mut trace = Vec::new();
    let mut choices = choices.iter();
    loop {
        let steps = world.steps();
        let step = match choices.next() {
            Some(&choice) if !steps.is_empty() => steps[usize::from(choice) % steps.len()],
            _ => match steps.into_iter().find(|step| !step.is_fault()) {
                Some(step) => step,
                None => {
                    return world
                        .check_done()
                        .map_err(|Broken(err)| Broken(format!("{err} after {trace:?}")));
                }
            },
        };
        trace.push(step);
        world.apply(step).map_err(|Broken(err)| Broken(format!("{err} after {trace:?}")))?;
        if trace.len() > 10_000 {
            let last = &trace[trace.len() - 40..];
            return Err(Broken::from(format!(
                "no end in sight after {} steps, the last {last:?} in {:?}",
                trace.len(),
                world.jetstream
            )));
        }
    }
}

//! Work over a slice split between this thread and one more: the agent's node has at least two CPUs, and the
//! start at 100,000 Services is CPU-bound (planning every Service; converting what the API server lists).

/// `f` of every item, in order. From `min` items on, the second half is mapped on a second thread while
/// this one maps the first; below it, the thread would cost more than it saves. Without a second thread
/// (the process is at its limit), all of them here.
pub(crate) fn map_in_halves<T: Sync, R: Send>(items: &[T], min: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    if items.len() < min.max(2) {
        return items.iter().map(f).collect();
    }
    let (here, there) = items.split_at(items.len() / 2);
    std::thread::scope(|s| {
        let mut out: Vec<R> = Vec::with_capacity(items.len());
        match std::thread::Builder::new().spawn_scoped(s, || there.iter().map(&f).collect::<Vec<_>>()) {
            Ok(other) => {
                out.extend(here.iter().map(&f));
                out.extend(other.join().expect("a thread mapping half of the items panicked"));
            }
            Err(_) => out.extend(items.iter().map(&f)),
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use super::map_in_halves;

    /// Below and above the threshold, odd and even lengths: every item once, in order, and the second half
    /// on another thread from the threshold on.
    #[test]
    fn every_item_is_mapped_once_in_order() {
        let here = std::thread::current().id();
        for (len, min) in [(0, 4), (1, 4), (3, 4), (4, 4), (5, 4), (1000, 64), (7, 0)] {
            let items: Vec<usize> = (0..len).collect();
            let out = map_in_halves(&items, min, |x| (*x * 3, std::thread::current().id()));
            let values: Vec<usize> = out.iter().map(|(v, _)| *v).collect();
            assert_eq!(values, items.iter().map(|x| x * 3).collect::<Vec<_>>(), "{len} items, min {min}");
            let elsewhere = out.iter().filter(|(_, t)| *t != here).count();
            let expected = if len >= min.max(2) { len - len / 2 } else { 0 };
            assert_eq!(elsewhere, expected, "{len} items, min {min}");
        }
    }
}

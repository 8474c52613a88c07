//! Serial and parallel execution share one closure, so the `parallel`
//! feature changes speed only, never results: each chunk's work is a pure
//! function of its inputs and its offset.

/// Calls `f(offset, chunk)` for consecutive chunks of `data`, on rayon's pool
/// when the `parallel` feature is on.
pub(crate) fn for_each_chunk<T: Send>(
    data: &mut [T],
    chunk_len: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    #[cfg(feature = "parallel")]
    {
        use rayon::prelude::*;
        data.par_chunks_mut(chunk_len)
            .enumerate()
            .for_each(|(k, c)| f(k * chunk_len, c));
    }
    #[cfg(not(feature = "parallel"))]
    {
        data.chunks_mut(chunk_len)
            .enumerate()
            .for_each(|(k, c)| f(k * chunk_len, c));
    }
}

/// Like [`for_each_chunk`], collecting what `f` returns for each chunk into
/// `results`, in chunk order (its allocation is reused). `f` also gets a
/// scratch slice as long as its chunk, filled with `S::default()`: each
/// worker thread's own, kept between calls (`scratch`, a thread-local
/// pool), so a chunk's intermediate results need no array as long as the
/// data and nothing is allocated once warm.
pub(crate) fn map_chunks<A: Send, S: Default + Clone + 'static, R: Send>(
    a: &mut [A],
    chunk_len: usize,
    scratch: &'static std::thread::LocalKey<std::cell::RefCell<Vec<S>>>,
    f: impl Fn(usize, &mut [A], &mut [S]) -> R + Sync + Send,
    results: &mut Vec<R>,
) {
    let run = |k: usize, ca: &mut [A]| {
        scratch.with(|cell| {
            let fresh = || vec![S::default(); ca.len()];
            match cell.try_borrow_mut() {
                Ok(mut s) => {
                    s.clear();
                    s.resize(ca.len(), S::default());
                    f(k * chunk_len, ca, &mut s)
                }
                // This thread is already inside `f` (it took another chunk
                // while waiting on nested work): a scratch of its own.
                Err(_) => f(k * chunk_len, ca, &mut fresh()),
            }
        })
    };
    #[cfg(feature = "parallel")]
    {
        use rayon::prelude::*;
        a.par_chunks_mut(chunk_len)
            .enumerate()
            .map(|(k, ca)| run(k, ca))
            .collect_into_vec(results);
    }
    #[cfg(not(feature = "parallel"))]
    {
        results.clear();
        results.extend(
            a.chunks_mut(chunk_len)
                .enumerate()
                .map(|(k, ca)| run(k, ca)),
        );
    }
}

/// Calls `f` on each item, on rayon's pool when the `parallel` feature is on.
pub(crate) fn for_each_mut<T: Send>(items: &mut [T], f: impl Fn(&mut T) + Sync + Send) {
    #[cfg(feature = "parallel")]
    {
        use rayon::prelude::*;
        items.par_iter_mut().for_each(f);
    }
    #[cfg(not(feature = "parallel"))]
    {
        items.iter_mut().for_each(f);
    }
}

/// Threads the work is shared among: the current rayon pool's, or 1 without
/// the `parallel` feature. Only ever sizes work, never changes results.
pub(crate) fn workers() -> usize {
    #[cfg(feature = "parallel")]
    {
        rayon::current_num_threads()
    }
    #[cfg(not(feature = "parallel"))]
    {
        1
    }
}

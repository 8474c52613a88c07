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

/// Like [`for_each_chunk`] over two equally long slices chunked in step,
/// collecting what `f` returns for each chunk into `results`, in chunk
/// order (its allocation is reused).
pub(crate) fn map_chunks2<A: Send, B: Send, R: Send>(
    a: &mut [A],
    b: &mut [B],
    chunk_len: usize,
    f: impl Fn(usize, &mut [A], &mut [B]) -> R + Sync + Send,
    results: &mut Vec<R>,
) {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(feature = "parallel")]
    {
        use rayon::prelude::*;
        a.par_chunks_mut(chunk_len)
            .zip(b.par_chunks_mut(chunk_len))
            .enumerate()
            .map(|(k, (ca, cb))| f(k * chunk_len, ca, cb))
            .collect_into_vec(results);
    }
    #[cfg(not(feature = "parallel"))]
    {
        results.clear();
        results.extend(
            a.chunks_mut(chunk_len)
                .zip(b.chunks_mut(chunk_len))
                .enumerate()
                .map(|(k, (ca, cb))| f(k * chunk_len, ca, cb)),
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

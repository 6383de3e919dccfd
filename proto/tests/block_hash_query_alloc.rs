//! A `BlockHashQuery` (alone, or as a query of a batch request) claiming a huge packed length in
//! a tiny buffer must not make the decoder reserve memory in proportion to the claim: a counting
//! global allocator records the largest single request made by this thread while decoding.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use ckf_proto::v1;
use prost::Message;
use prost::bytes::Buf;

struct Counting;

thread_local! {
    /// The largest allocation (or reallocation) size requested by this thread since reset.
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // `try_with`: the thread-local may already be gone while the thread exits.
    let _ = LARGEST.try_with(|largest| largest.set(largest.get().max(size)));
}

// SAFETY: forwards every call to `System` unchanged; only records sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The largest allocation `decode` makes.
fn largest_allocation(decode: impl FnOnce()) -> usize {
    LARGEST.with(|largest| largest.set(0));
    decode();
    LARGEST.with(Cell::get)
}

fn varint(mut value: u64, out: &mut Vec<u8>) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A buffer of `bytes` cut into pieces of `size` bytes (chained), so the claim straddles chunks.
fn chained(bytes: &[u8], size: usize) -> Box<dyn Buf> {
    let mut buf: Box<dyn Buf> = Box::new(&[][..]);
    for piece in bytes.chunks(size) {
        buf = Box::new(buf.chain(prost::bytes::Bytes::copy_from_slice(piece)));
    }
    buf
}

#[test]
fn huge_packed_claims_reserve_nothing_in_proportion() {
    let words: Vec<u8> = (0u64..4).flat_map(u64::to_le_bytes).collect();
    for claim in [
        40u64,
        1 << 20,
        1 << 40,
        1 << 63,
        (1 << 63) + 8,
        u64::MAX - 7,
    ] {
        // The query alone.
        let mut query = vec![0x0a];
        varint(claim, &mut query);
        query.extend_from_slice(&words);
        // The query nested in a batch request whose own length is honest.
        let mut batch = vec![0x0a];
        varint(query.len() as u64, &mut batch);
        batch.extend_from_slice(&query);
        // The query nested in a batch request that claims as much as the query does.
        let mut lying = vec![0x0a];
        varint(claim.saturating_add(12), &mut lying);
        lying.extend_from_slice(&query);

        for bytes in [&query, &batch, &lying] {
            // Generous: a few kilobytes of bookkeeping at most, never the claim.
            let bound = 4096 + 16 * bytes.len();
            for size in [bytes.len(), 1, 3, 8] {
                let largest = largest_allocation(|| {
                    let _ = v1::BlockHashQuery::decode(chained(bytes, size));
                    let _ = v1::FindMatchesBatchRequest::decode(chained(bytes, size));
                    let _ = v1::FindMatchesStreamRequest::decode(chained(bytes, size));
                    let _ = v1::BlockHashQuery::decode(&bytes[..]);
                    let _ = v1::FindMatchesBatchRequest::decode(&bytes[..]);
                });
                assert!(
                    largest <= bound,
                    "claim {claim}, chunks of {size}: largest allocation {largest} bytes \
                     (input {} bytes)",
                    bytes.len()
                );
            }
        }
    }
}

#[test]
fn the_allocation_probe_sees_a_large_reservation() {
    // The probe must be able to fail: a real 1 MiB reservation is seen.
    let largest = largest_allocation(|| {
        let v: Vec<u64> = Vec::with_capacity(1 << 17);
        std::hint::black_box(&v);
    });
    assert!(largest >= 1 << 20, "{largest}");
}

//! Just enough of a PNG reader for what rsvg-convert writes: 8-bit RGBA, or RGB when every pixel is opaque,
//! not interlaced, so that the render test can look at the pixels without another dependency.
use std::io::Read as _;

/// A decoded image: width, height, and RGBA bytes row by row.
pub(super) struct Image {
    pub(super) width: usize,
    pub(super) height: usize,
    pub(super) rgba: Vec<u8>,
}

impl Image {
    /// The alpha of the pixel at (x, y).
    pub(super) fn alpha(&self, x: usize, y: usize) -> u8 {
        self.rgba[(y * self.width + x) * 4 + 3]
    }
}

/// Decode `png`; an error says what is not the format expected.
pub(super) fn decode(png: &[u8]) -> Result<Image, String> {
    let body = png.strip_prefix(b"\x89PNG\r\n\x1a\n".as_slice()).ok_or("no PNG signature")?;
    let (mut rest, mut idat, mut size, mut channels) = (body, Vec::new(), None, 4);
    while rest.len() >= 12 {
        let len = u32::from_be_bytes(rest[0..4].try_into().expect("4 bytes")) as usize;
        let kind = &rest[4..8];
        let data = rest.get(8..8 + len).ok_or("chunk past the end")?;
        match kind {
            b"IHDR" => {
                let be = |i: usize| u32::from_be_bytes(data[i..i + 4].try_into().expect("4 bytes")) as usize;
                // Bit depth 8, colour type 6 (RGBA) or 2 (RGB), no interlacing.
                channels = match data[8..13] {
                    [8, 6, 0, 0, 0] => 4,
                    [8, 2, 0, 0, 0] => 3,
                    _ => {
                        return Err(format!("not 8-bit RGBA or RGB without interlacing: {:?}", &data[8..13]));
                    }
                };
                size = Some((be(0), be(4)));
            }
            b"IDAT" => idat.extend_from_slice(data),
            b"IEND" => break,
            _ => {}
        }
        rest = &rest[12 + len..];
    }
    let (width, height) = size.ok_or("no IHDR")?;
    let mut raw = Vec::new();
    flate2::read::ZlibDecoder::new(idat.as_slice()).read_to_end(&mut raw).map_err(|e| e.to_string())?;
    let stride = width * channels;
    if raw.len() != height * (stride + 1) {
        return Err(format!("{} bytes of scanlines for {width}x{height}", raw.len()));
    }
    // Unfiltered in place, `channels` bytes a pixel; then widened to RGBA.
    let mut px = vec![0u8; height * stride];
    for y in 0..height {
        let filter = raw[y * (stride + 1)];
        let line = &raw[y * (stride + 1) + 1..(y + 1) * (stride + 1)];
        for i in 0..stride {
            let a = if i >= channels { px[y * stride + i - channels] } else { 0 };
            let b = if y > 0 { px[(y - 1) * stride + i] } else { 0 };
            let c = if y > 0 && i >= channels { px[(y - 1) * stride + i - channels] } else { 0 };
            let predicted = match filter {
                0 => 0,
                1 => a,
                2 => b,
                3 => u8::midpoint(a, b),
                4 => paeth(a, b, c),
                f => return Err(format!("filter type {f}")),
            };
            px[y * stride + i] = line[i].wrapping_add(predicted);
        }
    }
    let rgba = if channels == 4 { px } else { px.chunks(3).flat_map(|p| [p[0], p[1], p[2], 255]).collect() };
    Ok(Image { width, height, rgba })
}

/// The PNG specification's Paeth predictor: of left, up and upper left, the nearest to left + up - upper left.
fn paeth(a: u8, b: u8, c: u8) -> u8 {
    let (ia, ib, ic) = (i16::from(a), i16::from(b), i16::from(c));
    let p = ia + ib - ic;
    let (pa, pb, pc) = ((p - ia).abs(), (p - ib).abs(), (p - ic).abs());
    if pa <= pb && pa <= pc {
        a
    } else if pb <= pc {
        b
    } else {
        c
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    /// A PNG of `rows` (each a filter byte and RGBA bytes) as a writer would lay it out.
    fn png(width: u32, rows: &[Vec<u8>]) -> Vec<u8> {
        let chunk = |out: &mut Vec<u8>, kind: &[u8], data: &[u8]| {
            out.extend_from_slice(&u32::try_from(data.len()).unwrap().to_be_bytes());
            out.extend_from_slice(kind);
            out.extend_from_slice(data);
            // The CRC is not checked by the reader.
            out.extend_from_slice(&[0; 4]);
        };
        let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut ihdr = width.to_be_bytes().to_vec();
        ihdr.extend_from_slice(&u32::try_from(rows.len()).unwrap().to_be_bytes());
        ihdr.extend_from_slice(&[8, 6, 0, 0, 0]);
        chunk(&mut out, b"IHDR", &ihdr);
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(&rows.concat()).unwrap();
        chunk(&mut out, b"IDAT", &z.finish().unwrap());
        chunk(&mut out, b"IEND", &[]);
        out
    }

    #[test]
    fn each_filter_type_is_undone() {
        // Two pixels a row; row 0 unfiltered, then Sub, Up, Average and Paeth rows that all decode to the
        // pixels (10,20,30,40) and (50,60,70,80).
        let px = [10u8, 20, 30, 40, 50, 60, 70, 80];
        let rows = vec![
            [&[0u8][..], &px].concat(),
            [&[1u8][..], &px[..4], &[40, 40, 40, 40]].concat(),
            [&[2u8][..], &[0; 8]].concat(),
            // Average: first pixel predicted by up/2, second by (left + up)/2.
            [&[3u8][..], &[5, 10, 15, 20], &[20, 20, 20, 20]].concat(),
            // Paeth: first pixel predicted by up (left and upper left are 0), second by left or up.
            [&[4u8][..], &[0; 4], &[0; 4]].concat(),
        ];
        let img = decode(&png(2, &rows)).unwrap();
        assert_eq!((img.width, img.height), (2, 5));
        for y in 0..5 {
            assert_eq!(&img.rgba[y * 8..y * 8 + 8], &px, "row {y}");
        }
        assert_eq!(img.alpha(1, 4), 80);
    }
}
